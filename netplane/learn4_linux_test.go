package netplane

import (
	"context"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
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
		mustDo(t, host, func() error { return GuardPort(ctx, n, "p-"+name, nil) })
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
	mustDo(t, host2, func() error { return GuardPort(ctx, n2, "p-c", nil) })
	v.MustRun(t, "ip", "addr", "add", "10.200.61.77/24", "dev", "eth0")
	if err := v.Ping(n2.Gateway.String(), 3); err == nil {
		t.Error("a static address reached the gateway with learnAddresses: false")
	}
	if got := nw2.alloc.BoundTo(mustMAC("52:55:55:00:61:0c")); len(got) != 0 {
		t.Errorf("learnAddresses: false bound %v", got)
	}
}
