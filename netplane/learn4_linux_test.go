package netplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/guard"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestLearnAddress: a VM that gives itself a free address of the subnet
// (no DHCP) reaches its gateway once its ARP announced it: the learner
// bound it, as a lease marked learned. Another VM that claims that
// address, or the gateway's, gets nothing, and nothing is learned while a
// port of the bridge is not guarded; on a network with `learnAddresses:
// false` a static address stays cut off.
func TestLearnAddress(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	host := testutil.NewNS(t, "la-host")
	n := testNet("la", api.ModeShared, "10.200.60.0/24")
	nw := start(t, host, n, Options{StateDir: t.TempDir()})
	nw.SetVMs(nil, nil) // as the controller does: the network's VMs are known
	plug := func(name, mac, addr string) *testutil.NS {
		t.Helper()
		v := vm(t, host, name, mac, n.Bridge(), false)
		host.MustDo(t, func() error { return guard.AddPort(ctx, n, "p-"+name, nil) })
		v.MustRun(t, "ip", "addr", "add", addr+"/24", "dev", "eth0")
		return v
	}
	macA, macB := mustMAC("52:55:55:00:60:0a"), mustMAC("52:55:55:00:60:0b")
	a := plug("a", macA.String(), "10.200.60.77")
	testutil.Eventually(t, 20*time.Second, func() error { return a.Ping(n.Gateway.String(), 1) }, "a static address to be learned")
	if l, ok := nw.alloc.Lookup(macA); !ok || !l.Learned || l.IP.String() != "10.200.60.77" {
		t.Errorf("a's binding: %+v %v, want 10.200.60.77 learned", l, ok)
	}
	// b claims a's address: three seconds of pings get nothing through.
	b := plug("b", macB.String(), "10.200.60.77")
	if err := b.Ping(n.Gateway.String(), 3); err == nil {
		t.Error("a VM claiming another's learned address reached the gateway")
	}
	if got := nw.alloc.BoundTo(macB); len(got) != 0 {
		t.Errorf("b was bound %v", got)
	}
	if l, ok := nw.alloc.Lookup(macA); !ok || l.IP.String() != "10.200.60.77" {
		t.Errorf("a lost its address to b's claim: %+v %v", l, ok)
	}
	// The gateway's address: never.
	b.MustRun(t, "ip", "addr", "flush", "dev", "eth0")
	b.MustRun(t, "ip", "addr", "add", n.Gateway.String()+"/24", "dev", "eth0")
	b.Run(ctx, "ping", "-c", "3", "-W", "1", "10.200.60.77")
	if got := nw.alloc.BoundTo(macB); len(got) != 0 {
		t.Errorf("b was bound %v claiming the gateway's address", got)
	}
	// A port the guard does not check (spoofCheck: false) may use
	// addresses nobody knows of: while there is one, nothing is learned.
	vm(t, host, "u", "52:55:55:00:60:0e", n.Bridge(), false)
	d := plug("d", "52:55:55:00:60:0d", "10.200.60.88")
	if err := d.Ping(n.Gateway.String(), 3); err == nil {
		t.Error("an address was learned beside an unguarded port")
	}
	// Strict: learnAddresses: false.
	host2 := testutil.NewNS(t, "lb-host")
	n2 := testNet("lb", api.ModeShared, "10.200.61.0/24")
	n2.NoAddressLearning = true
	nw2 := start(t, host2, n2, Options{StateDir: t.TempDir()})
	nw2.SetVMs(nil, nil)
	v := vm(t, host2, "c", "52:55:55:00:61:0c", n2.Bridge(), false)
	host2.MustDo(t, func() error { return guard.AddPort(ctx, n2, "p-c", nil) })
	v.MustRun(t, "ip", "addr", "add", "10.200.61.77/24", "dev", "eth0")
	if err := v.Ping(n2.Gateway.String(), 3); err == nil {
		t.Error("a static address reached the gateway with learnAddresses: false")
	}
	if got := nw2.alloc.BoundTo(mustMAC("52:55:55:00:61:0c")); len(got) != 0 {
		t.Errorf("learnAddresses: false bound %v", got)
	}
}

// TestLearnAnswersOnce: a guest that asks for its gateway once, from an
// address of its own (vmnet-helper's own tests do, and so may a VMM's
// first probe), hears the gateway's answer to that one request, even
// asked before the controller told the network its VMs: the guard
// dropped it, the learner kept it until then, bound the address and
// answered for the kernel, which has the guest as a neighbour as if it
// had heard it.
func TestLearnAnswersOnce(t *testing.T) {
	needRoot(t)
	host := testutil.NewNS(t, "lo-host")
	n := testNet("lo", api.ModeShared, "10.200.62.0/24")
	nw := start(t, host, n, Options{StateDir: t.TempDir()})
	v := testutil.NewNS(t, "lo-vm")
	s := plugLearning(t, host, n, "p-o", v)
	got := captureFrames(t, v)
	mac, ip := mustMAC("52:55:55:00:62:0a"), netip.MustParseAddr("10.200.62.254")
	// Heard before the controller told the network its VMs (a network
	// that just came up): kept, and claimed once they are known.
	s.Send(t, arpFrom(mac, ip, n.Gateway))
	testutil.Eventually(t, 20*time.Second, func() error {
		if nw.learner4.Deferred() == 0 {
			return errors.New("the claim is not kept yet")
		}
		return nil
	}, "the early claim to be kept")
	nw.SetVMs(nil, nil)
	reply := append([]byte{0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 2}, hostnet.BridgeMAC(n.ID)...)
	reply = append(append(append(reply, n.Gateway.AsSlice()...), mac...), ip.AsSlice()...)
	testutil.Eventually(t, 20*time.Second, func() error {
		if got.holding(reply) == 0 {
			return fmt.Errorf("no ARP reply from %s to %s yet", n.Gateway, ip)
		}
		return nil
	}, "the gateway's answer to the one request")
	if l, ok := nw.alloc.Lookup(mac); !ok || !l.Learned || l.IP != ip {
		t.Errorf("the asker's lease: %+v %v, want %s learned", l, ok, ip)
	}
	if out := host.MustRun(t, "ip", "neigh", "show", "dev", n.Bridge(), ip.String()); !strings.Contains(out, mac.String()) {
		t.Errorf("the host has no neighbour entry %s at %s: %q", ip, mac, out)
	}
}

// arpFrom is a broadcast ARP request, Ethernet source and sender both
// mac, the sender address sender, asking for target.
func arpFrom(mac net.HardwareAddr, sender, target netip.Addr) []byte {
	f := append([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, mac...)
	f = append(f, 0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1)
	f = append(f, mac...)
	f = append(f, sender.AsSlice()...)
	f = append(f, 0, 0, 0, 0, 0, 0)
	return append(f, target.AsSlice()...)
}

// TestLearnHostile: guests that write raw ARP on their own ports claim
// what is not theirs to learn: another VM's learned address, the
// gateway's, an address under another VM's MAC, and a flood of free
// addresses. None is bound but one free address per MAC; the VM whose
// address was claimed keeps it; and no claim reaches another VM or the
// host (another VM's neighbour table never hears of the guests' MACs; the
// host's has each only at the one address bound to it, as the learner
// answered for the gateway).
func TestLearnHostile(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	host := testutil.NewNS(t, "lh-host")
	n := testNet("lh", api.ModeShared, "10.200.64.0/24")
	nw := start(t, host, n, Options{StateDir: t.TempDir()})
	nw.SetVMs(nil, nil)
	addr := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	// The victim: a VM with a static address, learned.
	macV := mustMAC("52:55:55:00:64:0a")
	victim := vm(t, host, "v", macV.String(), n.Bridge(), false)
	host.MustDo(t, func() error { return guard.AddPort(ctx, n, "p-v", nil) })
	victim.MustRun(t, "ip", "addr", "add", "10.200.64.77/24", "dev", "eth0")
	testutil.Eventually(t, 20*time.Second, func() error { return victim.Ping(n.Gateway.String(), 1) }, "the victim's address to be learned")

	macA, macB, macC := mustMAC("52:55:55:00:64:a0"), mustMAC("52:55:55:00:64:b0"), mustMAC("52:55:55:00:64:c0")
	a := plugLearning(t, host, n, "p-a", testutil.NewNS(t, "lh-a"))
	b := plugLearning(t, host, n, "p-b", testutil.NewNS(t, "lh-b"))
	c := plugLearning(t, host, n, "p-c", testutil.NewNS(t, "lh-c"))
	bound := func(mac net.HardwareAddr) []netip.Addr { return nw.alloc.BoundTo(mac) }
	// A: under the victim's MAC, then the victim's address and the
	// gateway's under its own, then a free one: the learner hears them in
	// order, so once the free one is bound the others were refused.
	a.Send(t, arpFrom(macV, addr("10.200.64.99"), n.Gateway),
		arpFrom(macA, addr("10.200.64.77"), n.Gateway),
		arpFrom(macA, n.Gateway, n.Gateway),
		arpFrom(macA, addr("10.200.64.120"), n.Gateway))
	testutil.Eventually(t, 10*time.Second, func() error {
		if got := bound(macA); len(got) != 1 || got[0] != addr("10.200.64.120") {
			return fmt.Errorf("A is bound to %v", got)
		}
		return nil
	}, "A's free address to be learned")
	if got := bound(macV); len(got) != 1 || got[0] != addr("10.200.64.77") {
		t.Errorf("the victim is bound to %v, want its 10.200.64.77", got)
	}
	// B: a flood of free addresses, then C's one as a marker.
	var flood [][]byte
	for i := range 40 {
		flood = append(flood, arpFrom(macB, addr(fmt.Sprintf("10.200.64.%d", 130+i)), n.Gateway))
	}
	b.Send(t, flood...)
	c.Send(t, arpFrom(macC, addr("10.200.64.200"), n.Gateway))
	testutil.Eventually(t, 10*time.Second, func() error {
		if got := bound(macC); len(got) != 1 {
			return fmt.Errorf("C is bound to %v", got)
		}
		return nil
	}, "C's address to be learned")
	if got := bound(macB); len(got) != 1 {
		t.Errorf("a flood of 40 claims bound B to %v, want one address", got)
	}
	// Nobody else heard a claim: the victim nothing of them, the host
	// (answered for by the learner) each at the one address bound to it.
	if neigh := victim.MustRun(t, "ip", "neigh", "show"); strings.Contains(neigh, "52:55:55:00:64") && !strings.Contains(neigh, macV.String()) {
		t.Errorf("the victim's neighbour table heard of the claimers:\n%s", neigh)
	}
	for _, line := range strings.Split(host.MustRun(t, "ip", "neigh", "show"), "\n") {
		for _, mac := range []net.HardwareAddr{macA, macB, macC} {
			if f := strings.Fields(line); strings.Contains(line, mac.String()) && (len(bound(mac)) != 1 || f[0] != bound(mac)[0].String()) {
				t.Errorf("the host's neighbour table has %s at an address not bound to it (%v): %s", mac, bound(mac), line)
			}
		}
	}
	if strings.Contains(victim.MustRun(t, "ip", "neigh", "show"), "10.200.64.77") {
		t.Errorf("the victim learned its own address as someone else's")
	}
}
