package helper

import (
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestCleanupChildNotThroughSudo: the cleanup child of a helper run
// through sudo is started without sudo's variables, so that Main, which
// refuses the cleanup flag through sudo, runs it.
func TestCleanupChildNotThroughSudo(t *testing.T) {
	t.Setenv("SUDO_UID", "65534")
	t.Setenv("SUDO_GID", "65534")
	s := &session{o: &Options{}, tapName: "vmt-x"}
	cmd, err := s.cleanupCommand(0)
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range cmd.Env {
		if strings.HasPrefix(kv, "SUDO_") {
			t.Errorf("the cleanup child gets %s: it would be refused as run through sudo", kv)
		}
	}
	if len(cmd.Env) == 0 {
		t.Errorf("the cleanup child gets no environment at all")
	}
}

// TestSudoPortNames: through sudo, the helper makes only TAPs with a VM
// port's name, not a network's bridge to come or an interface of the
// host's.
func TestSudoPortNames(t *testing.T) {
	t.Setenv("SUDO_UID", "65534")
	t.Setenv("SUDO_GID", "65534")
	testutil.RequireRoot(t, "a helper run through sudo is root")
	for _, name := range []string{"vmn-future", "eth9", "docker0"} {
		if err := checkSudoPort(&api.Network{ID: "shared"}, name); err == nil || !strings.Contains(err.Error(), "only TAPs named") {
			t.Errorf("--tap %s through sudo: %v, want refused", name, err)
		}
	}
}
