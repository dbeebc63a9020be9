package controller_test

import (
	"net"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestMergedSegments: two VMs without offloads on one network, their ports
// guarded. Each helper merges its VM's TCP segments on their way to the
// bridge (relay/coalesce.go); the guard checks the merged packets, and the
// kernel cuts them again for the other VM's port, which has no offloads:
// every byte arrives in order both ways, and the sender's port took fewer
// packets than its VM sent frames.
func TestMergedSegments(t *testing.T) {
	h := newHost(t)
	h.MustVmnetctl("up", "-f", h.WriteFile("vms.yaml", twoVMs))
	st := h.Status()
	as, bs := h.Attachment(st, "a"), h.Attachment(st, "b")
	a, b := h.VM(as), h.VM(bs)
	a.DHCP(t)
	lb := b.DHCP(t)
	const size = 8 << 20
	for _, toDialer := range []bool{false, true} {
		sent, taken := txPackets(t, a.NS, "eth0"), rxPackets(t, h.NS, as.Tap)
		gbps := testutil.StreamChecked(t, b.NS, a.NS, net.JoinHostPort(lb["ip"], "0"), size, toDialer)
		sent, taken = txPackets(t, a.NS, "eth0")-sent, rxPackets(t, h.NS, as.Tap)-taken
		if toDialer {
			t.Logf("b to a: %.2f Gbit/s", gbps)
			continue
		}
		t.Logf("a to b: %.2f Gbit/s; a sent %d frames, its port took %d packets", gbps, sent, taken)
		// How many merge depends on how many frames each recvmmsg finds,
		// which the load decides; without merging there are as many.
		if sent < size/1500 || taken >= sent {
			t.Errorf("a sent %d frames and its port took %d packets: not merged", sent, taken)
		}
	}
	for _, vm := range []string{"a", "b"} {
		if d := h.Attachment(h.Status(), vm).SpoofDrops; d != 0 {
			t.Errorf("%s's guard dropped %d frames", vm, d)
		}
	}
}

func txPackets(t *testing.T, ns *testutil.NS, link string) uint64 {
	return linkStats(t, ns, link).TxPackets
}

func rxPackets(t *testing.T, ns *testutil.NS, link string) uint64 {
	return linkStats(t, ns, link).RxPackets
}

func linkStats(t *testing.T, ns *testutil.NS, name string) netlink.LinkStatistics {
	t.Helper()
	var s netlink.LinkStatistics
	if err := ns.Do(func() error {
		l, err := netlink.LinkByName(name)
		if err == nil {
			s = *l.Attrs().Statistics
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return s
}
