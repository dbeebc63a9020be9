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

// TestControllerPreparesHelper: the controller sets an attachment's helper
// up itself and starts only vmnetctl-relay (beside vmnetctl, as a package
// installs it), which says so in its log; the process shows `vmnetctl
// helper`'s command line, by which the controller knows it. A helper it
// does not set up (attach: tap) runs vmnetctl-helper.
func TestControllerPreparesHelper(t *testing.T) {
	h := newHost(t)
	vms := h.WriteFile("vms.yaml", "vms:\n  a:\n    networks:\n      - vmnet: shared\n  t:\n    networks:\n      - vmnet: shared\n        attach: tap\n")
	h.MustVmnetctl("up", "-f", vms)
	a := h.Attachment(h.Status(), "a")
	log, err := os.ReadFile(statedir.Dir{Path: h.StateDir()}.HelperLogFile("a/0"))
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(log), "\n")
	want := "running " + filepath.Join(filepath.Dir(h.Binary), relay.Binary) + ", set up by the controller"
	if !strings.Contains(first, want) {
		t.Errorf("the helper's log begins %q, want it to say %q", first, want)
	}
	log, err = os.ReadFile(statedir.Dir{Path: h.StateDir()}.HelperLogFile("t/0"))
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ = strings.Cut(string(log), "\n")
	want = "running " + h.Binary + " (" + filepath.Join(filepath.Dir(h.Binary), helper.Binary) + ") on Linux"
	if !strings.Contains(first, want) {
		t.Errorf("attach: tap: the helper's log begins %q, want it to say %q", first, want)
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
