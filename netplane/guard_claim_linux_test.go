package netplane

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/guard"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/nettypes"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// claimFrame is a broadcast ARP probe (sender 0.0.0.0) from mac.
func claimFrame(mac net.HardwareAddr) []byte {
	f := append([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, mac...)
	f = append(f, 0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1)
	f = append(f, mac...)
	f = append(f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 200, 10, 9)
	return f
}

// plugLearning joins VM namespace v to n's bridge in host through port, a
// veth whose peer is v's eth0, guarded as a learning port (no MAC pinned)
// before it joins, and returns a sender of raw frames on eth0. eth0 has no
// IPv6 of the kernel's own: only the test's frames leave it.
func plugLearning(t *testing.T, host *testutil.NS, n *api.Network, port string, v *testutil.NS) *testutil.RawSender {
	t.Helper()
	testutil.Run(t, "ip", "-n", host.Name, "link", "add", port, "up", "type", "veth", "peer", "name", "eth0", "netns", v.Name)
	v.MustRun(t, "sysctl", "-qw", "net.ipv6.conf.eth0.disable_ipv6=1")
	v.MustRun(t, "ip", "link", "set", "eth0", "up")
	host.MustDo(t, func() error {
		if err := guard.AddPort(context.Background(), n, port, nil); err != nil {
			return err
		}
		l, err := netlink.LinkByName(port)
		if err != nil {
			return err
		}
		return AttachPort(n.Bridge(), l, false)
	})
	return newRawSender(t, v)
}

// claimLab is a host namespace with network n's bridge (named label, on
// subnet), for the guard's claims, and a reader of its guard's MACs.
func claimLab(t *testing.T, label, subnet string) (*testutil.NS, *api.Network, func() *guard.State) {
	t.Helper()
	host := testutil.NewNS(t, label+"-host")
	n := testNet(label, api.ModeShared, subnet)
	host.MustRun(t, "ip", "link", "add", n.Bridge(), "up", "type", "bridge")
	return host, n, func() *guard.State {
		var st *guard.State
		host.MustDo(t, func() (err error) { st, err = guard.ReadState(context.Background(), n.ID); return err })
		return st
	}
}

// TestGuardClaims: a learning port learns its own expected MAC or one no
// port holds or expects, never another's, even before the other VM sent
// a frame; of two learning ports, the first to use a MAC keeps it; a port
// that holds a MAC does not claim a second one (the add to claimed after
// the failed add to its full set does not run); a port guarded again
// releases its MAC; no port may be pinned to another's MAC; ClaimPorts
// takes an expected MAC back from the port that learned it first.
func TestGuardClaims(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	host, n, state := claimLab(t, "gc", "10.200.10.0/24")
	macA, macB := mustMAC("52:55:55:00:0a:0a"), mustMAC("52:55:55:00:0a:0b")
	free1, free2 := mustMAC("52:55:55:00:0a:f1"), mustMAC("52:55:55:00:0a:f2")
	vms := map[string]*testutil.RawSender{}
	for _, name := range []string{"a", "b", "c"} {
		vms[name] = plugLearning(t, host, n, "p-"+name, testutil.NewNS(t, "gc-"+name))
	}
	// A and B are the controller's, with their MACs; C is a helper of
	// its own (any MAC works).
	host.MustDo(t, func() error {
		return guard.ClaimPorts(ctx, n, map[string]net.HardwareAddr{"p-a": macA, "p-b": macB}, nettypes.ClaimOptions{PortsGone: true})
	})
	drops := func(name string) uint64 {
		var d map[string]uint64
		host.MustDo(t, func() (err error) { d, err = guard.Drops(ctx, n.ID, nil); return err })
		return d["p-"+name]
	}
	// send has name's VM send a frame from mac, and waits for its port
	// to hold want ("" for nothing) and, if dropped, for its drop.
	send := func(name string, mac net.HardwareAddr, want string, dropped bool) {
		t.Helper()
		before := drops(name)
		vms[name].Send(t, claimFrame(mac))
		testutil.Eventually(t, 5*time.Second, func() error {
			if got := state().Learned["p-"+name]; got != want {
				return fmt.Errorf("port %s holds %q, want %q", name, got, want)
			}
			if d := drops(name); dropped != (d > before) {
				return fmt.Errorf("port %s dropped %d frames, had %d (want a drop: %v)", name, d, before, dropped)
			}
			return nil
		}, "port %s after a frame from %s", name, mac)
	}

	// C takes A's expected MAC before A sent anything: dropped.
	send("c", macA, "", true)
	if st := state(); st.Learned["p-c"] != "" || !st.Claimed[macA.String()] {
		t.Fatalf("after C's frame from A's MAC: %+v", st)
	}
	send("a", macA, macA.String(), false)
	// B uses a MAC of its own choice (nobody's): learned and claimed.
	send("b", free1, free1.String(), false)
	if !state().Claimed[free1.String()] {
		t.Fatalf("B's MAC %s is not claimed", free1)
	}
	// C, a second learning port, is refused the MAC B uses.
	send("c", free1, "", true)
	// B, which holds a MAC, sends from another nobody holds: dropped, and
	// the MAC not claimed (the rule stopped at the failed add).
	send("b", free2, free1.String(), true)
	if state().Claimed[free2.String()] {
		t.Fatalf("B's dropped frame from %s claimed it", free2)
	}
	// Now C may take the second: it is nobody's.
	send("c", free2, free2.String(), false)

	// Pinning: not to A's MAC (expected for p-a), nor to C's learned one,
	// for another port; a port keeps its own.
	for _, c := range []struct {
		port string
		mac  net.HardwareAddr
	}{{"p-c", macA}, {"p-b", free2}} {
		err := host.Do(func() error { return guard.AddPort(ctx, n, c.port, c.mac) })
		if err == nil || !strings.Contains(err.Error(), "another VM port's") {
			t.Errorf("pinning %s to %s: %v, want a refusal", c.port, c.mac, err)
		}
	}
	if st := state(); st.Learned["p-c"] != free2.String() || st.Learned["p-b"] != free1.String() {
		t.Fatalf("a refused pin changed the ports: %+v", st.Learned)
	}
	host.MustDo(t, func() error { return guard.AddPort(ctx, n, "p-a", macA) })

	// B guarded again (its VMM restarted): the MAC it held is released,
	// and it learns one again.
	host.MustDo(t, func() error { return guard.AddPort(ctx, n, "p-b", nil) })
	if st := state(); st.Claimed[free1.String()] {
		t.Fatalf("B's old MAC %s still claimed after B was guarded again", free1)
	}
	send("b", free1, free1.String(), false)

	// B's attachment now expects C's MAC: ClaimPorts takes it from C,
	// whose frames from it are then dropped; from its memo too (which
	// knows nothing of what C learned: it looks the new MAC up).
	host.MustDo(t, func() error {
		return guard.ClaimPorts(ctx, n, map[string]net.HardwareAddr{"p-a": macA, "p-b": free2}, nettypes.ClaimOptions{PortsGone: true})
	})
	st := state()
	if st.Learned["p-c"] != "" || !st.Claimed[free2.String()] || !st.Owns[guard.PortMAC{MAC: free2.String(), Port: "p-b"}] || st.Owns[guard.PortMAC{MAC: macB.String(), Port: "p-b"}] {
		t.Fatalf("after ClaimPorts gave %s to B: %+v", free2, st)
	}
	send("c", free2, "", true)

	// Deleting a port's guard releases the MAC it held unless expected.
	host.MustDo(t, func() error { return guard.RemovePort(ctx, n, "p-b") })
	if st := state(); !st.Claimed[free2.String()] || st.Claimed[free1.String()] {
		t.Fatalf("after B's guard went: claimed %v, want %s (expected) and not %s", st.Claimed, free2, free1)
	}
}

// TestGuardFixedWithoutDHCP: on a network without DHCP (with or without
// the DNS proxy), a VM's IPv4 source
// must be its fixed address (a VM file's ip:): the VM with one reaches the
// gateway from it and not from another address; a VM without one is not
// let through with an address it gave itself.
func TestGuardFixedWithoutDHCP(t *testing.T) {
	for _, proxy := range []bool{true, false} {
		t.Run(fmt.Sprintf("dnsProxy=%v", proxy), func(t *testing.T) { testGuardFixedWithoutDHCP(t, proxy) })
	}
}

func testGuardFixedWithoutDHCP(t *testing.T, dnsProxy bool) {
	needRoot(t)
	ctx := context.Background()
	host := testutil.NewNS(t, "gf-host")
	n := testNet("gf", api.ModeShared, "10.200.53.0/24")
	n.DHCP, n.DNSProxy = false, dnsProxy
	nw := start(t, host, n, Options{StateDir: t.TempDir()})
	macA, macB := mustMAC("52:55:55:00:53:0a"), mustMAC("52:55:55:00:53:0b")
	if err := nw.SetHost(macA, "a", ip("10.200.53.10")); err != nil {
		t.Fatal(err)
	}
	vms := map[string]*testutil.NS{}
	for name, mac := range map[string]net.HardwareAddr{"a": macA, "b": macB} {
		vms[name] = vm(t, host, name, mac.String(), n.Bridge(), false)
		host.MustDo(t, func() error { return guard.AddPort(ctx, n, "p-"+name, mac) })
	}
	try := func(v *testutil.NS, addr string) error {
		v.MustRun(t, "ip", "addr", "flush", "dev", "eth0")
		v.MustRun(t, "ip", "addr", "add", addr+"/24", "dev", "eth0")
		return v.Ping(n.Gateway.String(), 1)
	}
	testutil.Eventually(t, 10*time.Second, func() error { return try(vms["a"], "10.200.53.10") }, "a to reach the gateway from its fixed address")
	if err := try(vms["a"], "10.200.53.11"); err == nil {
		t.Errorf("a reaches the gateway from an address that is not its fixed one")
	}
	if err := try(vms["b"], "10.200.53.12"); err == nil {
		t.Errorf("b, with no fixed address, reaches the gateway from one it gave itself")
	}
}

// TestGuardAddressesAfterTableLoss: the guard table deleted behind the
// network's back and made again by a port's repair (without the network's
// restart) gets its bound addresses back at the next resync: the resync
// reads the kernel, not what it installed before.
func TestGuardAddressesAfterTableLoss(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	host := testutil.NewNS(t, "ga-host")
	n := testNet("ga", api.ModeShared, "10.200.54.0/24")
	nw := start(t, host, n, Options{StateDir: t.TempDir()})
	mac := mustMAC("52:55:55:00:54:0a")
	if err := nw.SetHost(mac, "a", ip("10.200.54.10")); err != nil {
		t.Fatal(err)
	}
	bound := func() bool {
		out := host.MustRun(t, "nft", "list", "set", "bridge", hostnet.TableName(n.ID), guard.SetAddrs)
		return strings.Contains(out, "10.200.54.10")
	}
	if !bound() {
		t.Fatal("the fixed address is not in the guard's set")
	}
	resync := func() {
		t.Helper()
		if err := nw.guard.SyncAll(ctx); err != nil {
			t.Fatal(err)
		}
	}
	host.MustRun(t, "nft", "delete", "table", "bridge", hostnet.TableName(n.ID))
	host.MustRun(t, "ip", "link", "add", "p-a", "type", "veth", "peer", "name", "p-a-peer")
	host.MustDo(t, func() error { return guard.AddPort(ctx, n, "p-a", mac) }) // the ports' repair
	if bound() {
		t.Fatal("the set survived its table's deletion")
	}
	resync()
	if !bound() {
		t.Error("after the resync the guard's set still lacks the VM's address")
	}

	// A resync that found the set right twice, guard.TrustGap apart,
	// trusts it while the nftables generation stands (the third reads
	// nothing); an element deleted behind its back moves the generation,
	// and the next resync puts it back. (The sleep is the rule's own gap
	// between two reads, not a wait for anything.)
	for i := range 3 {
		if i == 1 {
			time.Sleep(guard.TrustGap)
		}
		resync()
	}
	host.MustRun(t, "nft", "delete", "element", "bridge", hostnet.TableName(n.ID), guard.SetAddrs, "{", mac.String(), ".", "10.200.54.10", "}")
	if bound() {
		t.Fatal("the element survived its deletion")
	}
	resync()
	if !bound() {
		t.Error("after the resync the guard's set still lacks the deleted element")
	}
}

// TestGuardStalePort: the guard of a port that is gone (its helper exited)
// releases its MAC when another port is guarded, so a helper started again
// under another TAP name learns its VM's MAC again; a port the controller
// claimed is an expected port (which sudo's helper may not take).
func TestGuardStalePort(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	host := testutil.NewNS(t, "gs-host")
	n := testNet("gs", api.ModeShared, "10.200.55.0/24")
	host.MustRun(t, "ip", "link", "add", n.Bridge(), "up", "type", "bridge")
	mac := mustMAC("52:55:55:00:55:0a")
	v := testutil.NewNS(t, "gs-vm")
	learned := func(port string) string {
		var st *guard.State
		host.MustDo(t, func() (err error) { st, err = guard.ReadState(ctx, n.ID); return err })
		return st.Learned[port]
	}
	for _, port := range []string{"p-old", "p-new"} {
		s := plugLearning(t, host, n, port, v)
		s.Send(t, claimFrame(mac))
		testutil.Eventually(t, 5*time.Second, func() error {
			if got := learned(port); got != mac.String() {
				return fmt.Errorf("%s holds %q", port, got)
			}
			return nil
		}, "%s to learn the VM's MAC", port)
		host.MustRun(t, "ip", "link", "del", port) // the helper exits
	}
	host.MustDo(t, func() error {
		if err := guard.ClaimPorts(ctx, n, map[string]net.HardwareAddr{"vmt-claimed": mac}, nettypes.ClaimOptions{Reread: true}); err != nil {
			return err
		}
		for port, want := range map[string]bool{"vmt-claimed": true, "vmt-other": false} {
			if got, err := guard.ExpectedPort(ctx, n, port); err != nil || got != want {
				return fmt.Errorf("ExpectedPort(%s) = %v, %v; want %v", port, got, err, want)
			}
		}
		return nil
	})
}

// TestClaimsWhenVMsGo: ClaimPorts without an attachment's MAC (its VM
// detached), reading only that attachment's port: the MAC stays claimed
// while its port still holds it (the helper not gone yet), leaves once the
// port went (looked for when a pass is told ports may have gone), and an
// expected MAC its port never used leaves at once; the
// other VM's claim stays throughout. Then another port may learn the MAC.
func TestClaimsWhenVMsGo(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	host, n, state := claimLab(t, "cg", "10.200.57.0/24")
	macA, macB, macC := mustMAC("52:55:55:00:57:0a"), mustMAC("52:55:55:00:57:0b"), mustMAC("52:55:55:00:57:0c")
	a := plugLearning(t, host, n, "p-a", testutil.NewNS(t, "cg-a"))
	plugLearning(t, host, n, "p-b", testutil.NewNS(t, "cg-b"))
	c := plugLearning(t, host, n, "p-c", testutil.NewNS(t, "cg-c"))
	claimWith := func(o nettypes.ClaimOptions, expected map[string]net.HardwareAddr) {
		t.Helper()
		host.MustDo(t, func() error { return guard.ClaimPorts(ctx, n, expected, o) })
	}
	claim := func(expected map[string]net.HardwareAddr) {
		t.Helper()
		claimWith(nettypes.ClaimOptions{PortsGone: true}, expected)
	}
	// learns has port's VM send from mac and waits for the port to hold it.
	learns := func(port string, vm *testutil.RawSender, mac net.HardwareAddr) {
		t.Helper()
		vm.Send(t, claimFrame(mac))
		testutil.Eventually(t, 5*time.Second, func() error {
			if got := state().Learned[port]; got != mac.String() {
				return fmt.Errorf("%s holds %q", port, got)
			}
			return nil
		}, "%s to learn %s", port, mac)
	}
	claim(map[string]net.HardwareAddr{"p-a": macA, "p-b": macB})
	learns("p-a", a, macA)

	// A and B detached; A's helper still runs, B's port never sent.
	claim(map[string]net.HardwareAddr{})
	st := state()
	if !st.Claimed[macA.String()] || st.ExpectedMACs[macA.String()] {
		t.Fatalf("A detached, its port still holding %s: claimed %v, expected %v", macA, st.Claimed, st.ExpectedMACs)
	}
	if st.Claimed[macB.String()] || st.ExpectedMACs[macB.String()] || len(st.Owns) != 0 {
		t.Fatalf("B detached: claimed %v, expected %v, owns %v", st.Claimed, st.ExpectedMACs, st.Owns)
	}
	// A's port goes with its helper: the MAC is free once a pass is told
	// that A's port may have gone (by its index: that guard alone is
	// looked at); one that only attaches reads no other port's guard,
	// and A's stays, as it does when told of a port that is still there.
	index := func(port string) uint32 {
		t.Helper()
		var l netlink.Link
		host.MustDo(t, func() (err error) { l, err = netlink.LinkByName(port); return err })
		return uint32(l.Attrs().Index)
	}
	indexA, indexB := index("p-a"), index("p-b")
	host.MustRun(t, "ip", "link", "del", "p-a")
	claimWith(nettypes.ClaimOptions{}, map[string]net.HardwareAddr{"p-b": macC})
	if st = state(); !st.Claimed[macA.String()] {
		t.Fatalf("A's port gone, no pass told of it: claimed %v, want %s still (not looked for)", st.Claimed, macA)
	}
	claimWith(nettypes.ClaimOptions{GonePorts: []uint32{indexB}}, map[string]net.HardwareAddr{"p-b": macC})
	if st = state(); !st.Claimed[macA.String()] || !st.Claimed[macC.String()] {
		t.Fatalf("A's port gone, a pass told of B's (there): claimed %v, want %s still and %s", st.Claimed, macA, macC)
	}
	claimWith(nettypes.ClaimOptions{GonePorts: []uint32{indexB, indexA}}, map[string]net.HardwareAddr{"p-b": macC})
	st = state()
	if st.Claimed[macA.String()] || !st.Claimed[macC.String()] {
		t.Fatalf("A's port gone: claimed %v, want %s free and %s claimed", st.Claimed, macA, macC)
	}
	// Its guard went in the same batch.
	if _, ok := st.Learned["p-a"]; ok {
		t.Errorf("A's port gone: its guard is still there (%v)", st.Learned)
	}
	learns("p-c", c, macA)
}

// TestPortMACsOfPorts: the MACs the bridge learned on a port, asked of
// that port alone (a project's status), are those of the whole dump; a
// port not on the bridge, or gone, has none.
func TestPortMACsOfPorts(t *testing.T) {
	needRoot(t)
	host, n, _ := claimLab(t, "pm", "10.200.58.0/24")
	macA, macB := mustMAC("52:55:55:00:58:0a"), mustMAC("52:55:55:00:58:0b")
	plugLearning(t, host, n, "p-a", testutil.NewNS(t, "pm-a")).Send(t, claimFrame(macA))
	plugLearning(t, host, n, "p-b", testutil.NewNS(t, "pm-b")).Send(t, claimFrame(macB))
	var all map[string][]string
	testutil.Eventually(t, 5*time.Second, func() error {
		host.MustDo(t, func() error { all = portMACs(n.Bridge(), nil); return nil })
		if !slices.Contains(all["p-a"], macA.String()) || !slices.Contains(all["p-b"], macB.String()) {
			return fmt.Errorf("the bridge learned %v", all)
		}
		return nil
	}, "the bridge to learn both VMs' MACs")
	var one map[string][]string
	host.MustDo(t, func() error { one = portMACs(n.Bridge(), []string{"p-a", "p-gone"}); return nil })
	if len(one) != 1 || !slices.Equal(one["p-a"], all["p-a"]) {
		t.Errorf("p-a's MACs asked of it alone: %v; of the whole bridge: %v", one, all["p-a"])
	}
}

// TestLeaseKeptWhileAttached: a VM the controller attached (SetHost) whose
// DHCP client never renews, and one with a static address the learner
// bound, keep their addresses in the guard for hours of the allocator's
// clock, through the guard's resyncs; once detached (RemoveHost) the
// expired lease's pair goes.
func TestLeaseKeptWhileAttached(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	host := testutil.NewNS(t, "lk-host")
	n := testNet("lk", api.ModeShared, "10.200.59.0/24")
	n.LeaseTime = time.Minute
	nw := start(t, host, n, Options{StateDir: t.TempDir()})
	start := time.Now()
	now := start
	nw.alloc.SetClock(func() time.Time { return now })
	mac := mustMAC("52:55:55:00:59:0a")
	off, err := nw.alloc.Offer(mac, netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nw.alloc.Commit(mac, off, ""); err != nil {
		t.Fatal(err)
	}
	if err := nw.SetHost(mac, "vm", netip.Addr{}); err != nil {
		t.Fatal(err)
	}
	bound := func(ip netip.Addr) bool {
		out := host.MustRun(t, "nft", "list", "set", "bridge", hostnet.TableName(n.ID), guard.SetAddrs)
		return regexp.MustCompile(regexp.QuoteMeta(ip.String()) + `([^0-9]|$)`).MatchString(out)
	}
	if !bound(off) {
		t.Fatalf("the lease %s is not in the guard", off)
	}
	// A VM with a static address, learned (its ARP announced it), also
	// attached.
	static, sip := mustMAC("52:55:55:00:59:0b"), netip.MustParseAddr("10.200.59.200")
	if err := nw.SetHost(static, "static", netip.Addr{}); err != nil {
		t.Fatal(err)
	}
	nw.SetVMs([]string{"vm", "static"}, []net.HardwareAddr{mac, static}) // as the controller's pass does
	if _, err := nw.alloc.Learn(static, sip); err != nil {
		t.Fatal(err)
	}
	host.MustDo(t, func() error { return nw.guard.SyncAll(ctx) })
	// Hours go by (the clock's), the guard resyncing now and then: the
	// lease long expired and never renewed, the learned address never
	// announced again.
	for range 3 {
		now = now.Add(time.Hour)
		host.MustDo(t, func() error { return nw.guard.SyncAll(ctx) })
		if !bound(off) || !bound(sip) {
			t.Fatalf("after %v: the never-renewed lease in the guard %v, the static address %v; want both", now.Sub(start), bound(off), bound(sip))
		}
	}
	host.MustDo(t, func() error { nw.RemoveHost(mac); nw.RemoveHost(static); return nil })
	if bound(off) {
		t.Errorf("a detached VM's expired lease is still in the guard")
	}
}

// TestClaimsWhenPortMoves: a MAC expected on a port that holds it, then
// expected on another port (its attachment's TAP name changed): the old
// port loses it and the new one may learn it, from the memo's pass too.
func TestClaimsWhenPortMoves(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	host, n, state := claimLab(t, "cm", "10.200.63.0/24")
	mac := mustMAC("52:55:55:00:63:0a")
	old := plugLearning(t, host, n, "p-old", testutil.NewNS(t, "cm-old"))
	host.MustDo(t, func() error {
		return guard.ClaimPorts(ctx, n, map[string]net.HardwareAddr{"p-old": mac}, nettypes.ClaimOptions{PortsGone: true})
	})
	old.Send(t, claimFrame(mac))
	testutil.Eventually(t, 5*time.Second, func() error {
		if got := state().Learned["p-old"]; got != mac.String() {
			return fmt.Errorf("p-old holds %q", got)
		}
		return nil
	}, "p-old to learn its MAC")
	host.MustDo(t, func() error {
		return guard.ClaimPorts(ctx, n, map[string]net.HardwareAddr{"p-new": mac}, nettypes.ClaimOptions{PortsGone: true})
	})
	if st := state(); st.Learned["p-old"] != "" || !st.Owns[guard.PortMAC{MAC: mac.String(), Port: "p-new"}] {
		t.Errorf("after the MAC moved to p-new: p-old holds %q, owns %v", st.Learned["p-old"], st.Owns)
	}
}
