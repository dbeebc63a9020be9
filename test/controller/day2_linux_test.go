package controller_test

import (
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/controller"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// exitCode runs vmnetctl and returns its exit status and stdout.
func exitCode(t *testing.T, h *host, args ...string) (int, string) {
	t.Helper()
	cmd := h.VmnetctlCommand(context.Background(), args...)
	out, err := cmd.Output()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &ee):
		return ee.ExitCode(), string(out)
	}
	t.Fatal(err)
	return 0, ""
}

// TestDay2: leases (with and without a controller), plan's detailed exit
// code, and up's exit status when something did not come up.
func TestDay2(t *testing.T) {
	h := newHost(t)
	vms := h.WriteFile("vms.yaml", twoVMs)
	h.MustVmnetctl("up", "-f", vms)
	st := h.Status()
	ips := map[string]string{}
	for _, vm := range []string{"a", "b"} {
		ips[vm] = h.VM(h.Attachment(st, vm)).DHCP(t)["ip"]
	}
	checkLeases := func(when string) {
		t.Helper()
		var l controller.LeaseList
		if err := json.Unmarshal([]byte(h.MustVmnetctl("leases", "--json")), &l); err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, x := range l.Leases {
			got[x.VM] = x.IP
			if x.Network != "shared" || x.MAC == "" || !x.Expiry.After(time.Now()) {
				t.Errorf("%s: lease %+v", when, x)
			}
		}
		if len(l.Leases) != 2 || got["a"] != ips["a"] || got["b"] != ips["b"] {
			t.Errorf("%s: leases %+v, want a at %s and b at %s", when, l.Leases, ips["a"], ips["b"])
		}
	}
	checkLeases("with a controller")
	if out := h.MustVmnetctl("leases", "shared"); !strings.Contains(out, ips["a"]) || !strings.Contains(out, "EXPIRES") {
		t.Errorf("leases shared:\n%s", out)
	}
	if _, err := h.Vmnetctl("leases", "nope"); err == nil {
		t.Errorf("leases of a network that is not up: no error")
	}

	// plan --detailed-exitcode: 0 without changes, 2 with.
	if code, out := exitCode(t, h, "plan", "--detailed-exitcode", "-f", vms); code != 0 {
		t.Errorf("plan --detailed-exitcode of the applied file: exit %d\n%s", code, out)
	}
	edited := h.WriteFile("edited.yaml", twoVMs+"  c:\n    networks:\n      - vmnet: shared\n")
	if code, out := exitCode(t, h, "plan", "--detailed-exitcode", "-p", "vms", "-f", edited); code != 2 || !strings.Contains(out, "c/0") {
		t.Errorf("plan --detailed-exitcode of an edit: exit %d, want 2\n%s", code, out)
	}

	// Without a controller, status and leases still read the leases.
	for _, p := range h.Pids() {
		if b, err := exec.Command("cat", "/proc/"+strconv.Itoa(p)+"/cmdline").Output(); err == nil && strings.Contains(string(b), "serve") && strings.Contains(string(b), h.StateDir()) {
			syscall.Kill(p, syscall.SIGKILL)
		}
	}
	testutil.Eventually(t, 10*time.Second, func() error {
		if st := h.Status(); st.Controller.Running {
			return errors.New("the controller still answers")
		}
		return nil
	}, "the controller to be gone")
	offline := h.Status()
	for _, vm := range []string{"a", "b"} {
		if got := h.Attachment(offline, vm).IP; got != ips[vm] {
			t.Errorf("offline status: %s's IP is %q, want %s", vm, got, ips[vm])
		}
	}
	if offline.Networks[0].Leases != 2 {
		t.Errorf("offline status: %d leases on shared, want 2", offline.Networks[0].Leases)
	}
	checkLeases("without a controller")

	// up of a VM whose network cannot come up (a link of the bridge's
	// name that is not vmnetctl's) prints the status and exits 1.
	h.MustRun(t, "ip", "link", "add", "vmn-isolated", "type", "veth", "peer", "name", "other0")
	bad := h.WriteFile("bad.yaml", "vms:\n  d:\n    networks:\n      - vmnet: isolated\n")
	if code, out := exitCode(t, h, "up", "-f", bad, "--json"); code != 1 || !json.Valid([]byte(out)) {
		t.Errorf("up of a VM on a network that cannot come up: exit %d (want 1), stdout valid JSON: %v\n%s", code, json.Valid([]byte(out)), out)
	}
}
