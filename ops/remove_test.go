package ops

import (
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/statedir"
)

// TestDownNamesNothing: `down` with neither -p, -f nor --all says how to
// name a project, --all with it, and which projects are up.
func TestDownNamesNothing(t *testing.T) {
	sd := statedir.Dir{Path: t.TempDir()}
	env := Env{StateDir: sd}
	if _, err := projectsToRemove(env, RemoveOptions{}); err == nil || !strings.Contains(err.Error(), "--all") || !strings.Contains(err.Error(), "none is up") {
		t.Errorf("down with nothing named, nothing up: %v", err)
	}
	if err := sd.SaveProject(&statedir.Project{Name: "web"}); err != nil {
		t.Fatal(err)
	}
	if _, err := projectsToRemove(env, RemoveOptions{}); err == nil || !strings.Contains(err.Error(), "up: web") {
		t.Errorf("down with nothing named, web up: %v", err)
	}
}
