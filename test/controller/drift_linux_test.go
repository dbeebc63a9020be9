package controller_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/netplane"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestDriftRepaired changes a running network behind the controller's back,
// one thing at a time, and waits for the controller to put it back: the
// VM reaches the gateway again and renews its lease, and status counts the
// repair.
func TestDriftRepaired(t *testing.T) {
	h := newHost(t)
	h.Env = append(h.Env, "VMNETCTL_RESYNC=1s")
	vms := h.WriteFile("vms.yaml", "vms:\n  a:\n    networks:\n      - vmnet: shared\n")
	h.MustVmnetctl("up", "-f", vms)
	st := h.Status()
	att := h.Attachment(st, "a")
	vm := h.VM(att)
	ip := vm.DHCP(t)["ip"]
	if err := vm.Ping(gateway, 1); err != nil {
		t.Fatalf("before any drift: %v", err)
	}
	br, table, tap := st.Networks[0].Bridge, netplane.TableName("shared"), att.Tap
	repairs := func() uint64 {
		for _, n := range h.Status().Networks {
			if n.Name == "shared" {
				return n.Repairs
			}
		}
		return 0
	}

	for _, d := range []struct {
		name string
		cmd  []string
		// network: the network itself drifted (and is repaired as a
		// whole); otherwise only the VM's port did.
		network bool
	}{
		{"bridge deleted", []string{"ip", "link", "del", br}, true},
		{"gateway address removed", []string{"ip", "addr", "flush", "dev", br}, true},
		{"nftables table deleted", []string{"nft", "delete", "table", "inet", table}, true},
		{"guard table deleted", []string{"nft", "delete", "table", "bridge", table}, true},
		{"TAP taken off the bridge", []string{"ip", "link", "set", tap, "nomaster"}, false},
		{"TAP deleted", []string{"ip", "link", "del", tap}, false},
	} {
		before := repairs()
		h.MustRun(t, d.cmd[0], d.cmd[1:]...)
		testutil.Eventually(t, 30*time.Second, func() error {
			if d.network && repairs() <= before {
				return fmt.Errorf("no repair counted yet")
			}
			for _, n := range h.Status().Networks {
				if n.State != "up" {
					return fmt.Errorf("network %s is %s: %s", n.Name, n.State, n.Error)
				}
			}
			if out, _ := h.Run(context.Background(), "ip", "link", "show", "master", br); !strings.Contains(out, tap+":") {
				return fmt.Errorf("%s is not a port of %s", tap, br)
			}
			if out, _ := h.Run(context.Background(), "nft", "list", "map", "bridge", table, "ports"); !strings.Contains(out, `"`+tap+`"`) {
				return fmt.Errorf("%s is not guarded: %s", tap, out)
			}
			return vm.Ping(gateway, 1)
		}, "repair after: %s", d.name)
		if got := vm.DHCP(t)["ip"]; got != ip {
			t.Errorf("after %s: the VM's lease is %s, was %s", d.name, got, ip)
		}
	}
	if out := h.MustVmnetctl("events"); strings.Count(out, "drift-found") < 4 || strings.Count(out, "drift-repaired") < 4 {
		t.Errorf("events after four network drifts:\n%s", out)
	}
}
