package controller_test

import (
	"net"
	"testing"

	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestRelayOffloads: two VMs without offloads on one network, their ports
// guarded. Each helper merges its VM's TCP segments on their way to the
// bridge (relay/coalesce.go); the guard checks the merged packets, and the
// kernel hands them to the other VM's port, which has TSO, whole, for its
// relay to cut into the VM's frames (relay/gso.go): every byte arrives in
// order both ways, and each port took fewer packets than its VM sent
// frames and handed fewer than its VM got.
func TestRelayOffloads(t *testing.T) {
	h := newHost(t)
	h.MustVmnetctl("up", "-f", h.WriteFile("vms.yaml", twoVMs))
	st := h.Status()
	as, bs := h.Attachment(st, "a"), h.Attachment(st, "b")
	a, b := h.VM(as), h.VM(bs)
	a.DHCP(t)
	lb := b.DHCP(t)
	const size = 8 << 20
	for _, toDialer := range []bool{false, true} {
		vmBefore, portBefore := a.LinkStats(t, "eth0"), h.LinkStats(t, as.Tap)
		gbps := testutil.StreamChecked(t, b.NS, a.NS, net.JoinHostPort(lb["ip"], "0"), size, toDialer)
		vm, port := a.LinkStats(t, "eth0"), h.LinkStats(t, as.Tap)
		// How many merge depends on how many frames each recvmmsg finds,
		// which the load decides; without the offloads there are as many
		// packets as frames each way.
		if !toDialer {
			sent, taken := vm.TxPackets-vmBefore.TxPackets, port.RxPackets-portBefore.RxPackets
			t.Logf("a to b: %.2f Gbit/s; a sent %d frames, its port took %d packets", gbps, sent, taken)
			if sent < size/1500 || taken >= sent {
				t.Errorf("a sent %d frames and its port took %d packets: not merged", sent, taken)
			}
			continue
		}
		got, handed := vm.RxPackets-vmBefore.RxPackets, port.TxPackets-portBefore.TxPackets
		t.Logf("b to a: %.2f Gbit/s; a got %d frames, its port handed %d packets", gbps, got, handed)
		if got < size/1500 || handed >= got {
			t.Errorf("a got %d frames and its port handed %d packets: not cut by the relay", got, handed)
		}
	}
	for _, vm := range []string{"a", "b"} {
		if d := h.Attachment(h.Status(), vm).SpoofDrops; d != 0 {
			t.Errorf("%s's guard dropped %d frames", vm, d)
		}
	}
}
