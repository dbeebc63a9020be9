package ops

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/spec"
	"github.com/vmnetctl/vmnetctl/spec/spectest"
	"github.com/vmnetctl/vmnetctl/statedir"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestOtherProjectsNamedAbsolute: a problem between the project of this
// command and a recorded one names this one's file as the user gave it,
// and the recorded one's by its absolute path when it was given relative
// (the user is not in the directory its `up` ran in). The message whole is
// in testdata/other-project-absolute.txt.
func TestOtherProjectsNamedAbsolute(t *testing.T) {
	nets, _ := api.LoadNetworks("networks.yaml", []byte(spectest.Networks))
	rec := &statedir.Project{Name: "old", Files: []statedir.ProjectFile{{Path: "vms.yaml", Abs: "/home/u/old/vms.yaml", Data: []byte(spectest.VMs)}}}
	mine := &statedir.Project{Name: "new", Files: []statedir.ProjectFile{{Path: "my/vms.yaml", Abs: "/srv/my/vms.yaml", Data: []byte("vms:\n  web:\n    networks: [{vmnet: shared}]\n")}}}
	l := &Loaded{Networks: nets}
	var diags api.Diagnostics
	l.Project, diags = spec.ParseProject(mine)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	_, err := l.DesiredWith(Env{}, []*statedir.Project{rec}, nil)
	if err == nil || !strings.Contains(err.Error(), "/home/u/old/vms.yaml") || !strings.Contains(err.Error(), "my/vms.yaml") || strings.Contains(err.Error(), "/srv/my/vms.yaml") {
		t.Fatalf("the collision names %v; want /home/u/old/vms.yaml and my/vms.yaml as given", err)
	}
	testutil.Golden(t, filepath.Join("testdata", "other-project-absolute.txt"), err.Error()+"\n")
}
