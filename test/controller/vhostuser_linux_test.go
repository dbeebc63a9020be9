package controller_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestVhostUserGuarded: a VM whose attachment is vhost-user (a VMM
// stand-in sharing its rings with the helper) is the guard's like any
// other: it leases and reaches its gateway; from another VM's address
// (a socket attachment's, on the same network), or a MAC not its own,
// its frames are dropped and counted, and the other VM still reaches
// the gateway from that address; status says its VMM is there.
func TestVhostUserGuarded(t *testing.T) {
	h := newHost(t)
	h.MustVmnetctl("up", "-f", h.WriteFile("vms.yaml", "vms:\n  vg:\n    networks:\n      - vmnet: shared\n        attach: vhost-user\n        macAddress: \"52:55:55:e7:00:01\"\n"+
		"  victim:\n    networks: [{vmnet: shared}]\n"))
	a := h.Attachment(h.Status(), "vg")
	vm := h.VM(a)
	lease := vm.DHCP(t)
	victim := h.VM(h.Attachment(h.Status(), "victim"))
	victimIP := strings.TrimSpace(victim.DHCP(t)["ip"])
	if err := vm.Ping(gateway, 2); err != nil {
		t.Fatalf("from its lease %s: %v", lease["ip"], err)
	}
	testutil.Eventually(t, time.Minute, func() error {
		if p := h.Attachment(h.Status(), "vg").Peer; p != "connected" {
			return fmt.Errorf("peer %q", p)
		}
		return nil
	}, "status to say the VM is connected")
	// The gateway's MAC, kept: a flushed address or a new MAC flushes
	// the neighbours, and the ARP requests would be dropped too.
	gw := strings.Fields(vm.MustRun(t, "ip", "neigh", "show", gateway, "dev", "eth0"))
	if len(gw) < 3 || gw[1] != "lladdr" {
		t.Fatalf("the VM's neighbour entry of the gateway: %q", gw)
	}
	spoofed := func(what string, act func()) {
		t.Helper()
		before := h.Attachment(h.Status(), "vg").SpoofDrops
		act()
		if out, err := vm.Run(context.Background(), "ping", "-c", "3", "-i", "0.2", "-W", "1", gateway); err == nil {
			t.Errorf("%s: the ping went through:\n%s", what, out)
		}
		testutil.Eventually(t, time.Minute, func() error {
			if d := h.Attachment(h.Status(), "vg").SpoofDrops; d <= before {
				return fmt.Errorf("%d spoofed frames dropped, %d before", d, before)
			}
			return nil
		}, what+": the guard to count the drops")
	}
	// The victim's address.
	spoofed("another VM's address", func() {
		vm.MustRun(t, "ip", "addr", "flush", "dev", "eth0")
		vm.MustRun(t, "ip", "addr", "add", victimIP+"/24", "dev", "eth0")
		vm.MustRun(t, "ip", "neigh", "replace", gateway, "lladdr", gw[2], "dev", "eth0", "nud", "permanent")
	})
	// Its own address back, from another MAC.
	spoofed("another MAC", func() {
		vm.MustRun(t, "ip", "addr", "flush", "dev", "eth0")
		vm.MustRun(t, "ip", "addr", "add", strings.TrimSpace(lease["ip"])+"/24", "dev", "eth0")
		vm.MustRun(t, "ip", "link", "set", "eth0", "address", "02:00:00:00:0e:0e")
		vm.MustRun(t, "ip", "neigh", "replace", gateway, "lladdr", gw[2], "dev", "eth0", "nud", "permanent")
	})
	// The victim is unaffected: it still reaches the gateway from its
	// address, and the host's neighbour entry for it is its own MAC.
	if err := victim.Ping(gateway, 2); err != nil {
		t.Errorf("the victim after the spoofing: %v", err)
	}
	if out := h.MustRun(t, "ip", "neigh", "show", victimIP); strings.Contains(out, "52:55:55:e7:00:01") || strings.Contains(out, "02:00:00:00:0e:0e") {
		t.Errorf("the host's neighbour entry for the victim's address names the spoofer: %s", out)
	}
}
