package controller_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/helper"
	"github.com/vmnetctl/vmnetctl/procid"
	"github.com/vmnetctl/vmnetctl/relay"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// TestControllerRunsVmnetctlHelper: the controller runs vmnetctl-helper
// (beside vmnetctl, as a package installs it) for an attachment's helper,
// which says so in its log, and the process shows `vmnetctl helper`'s
// command line, by which the controller knows it; set up, it is
// vmnetctl-relay.
func TestControllerRunsVmnetctlHelper(t *testing.T) {
	h := newHost(t)
	vms := h.WriteFile("vms.yaml", "vms:\n  a:\n    networks:\n      - vmnet: shared\n")
	h.MustVmnetctl("up", "-f", vms)
	a := h.Attachment(h.Status(), "a")
	log, err := os.ReadFile(statedir.Dir{Path: h.StateDir()}.HelperLogFile("a/0"))
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(log), "\n")
	want := "running " + h.Binary + " (" + filepath.Join(filepath.Dir(h.Binary), helper.Binary) + ") on Linux"
	if !strings.Contains(first, want) {
		t.Errorf("the helper's log begins %q, want it to say %q", first, want)
	}
	id, err := procid.Read(a.PID)
	if err != nil {
		t.Fatal(err)
	}
	if len(id.Cmdline) < 2 || id.Cmdline[0] != h.Binary || id.Cmdline[1] != "helper" {
		t.Errorf("the helper's command line is %q, want %s helper ...", id.Cmdline, h.Binary)
	}
	if exe, err := os.Readlink("/proc/" + strconv.Itoa(a.PID) + "/exe"); err != nil || filepath.Base(exe) != relay.Binary {
		t.Errorf("the ready helper runs %s (%v), want %s", exe, err, relay.Binary)
	}
}
