package netplane

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/net/ipv6"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/guard"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// g6Net is a shared network with IPv6 for the guard's tests.
func g6Net() *api.Network {
	n := testNet("g6", api.ModeShared, "10.200.9.0/24")
	n.Subnet6 = netip.MustParsePrefix("fd00:99::/64")
	n.Gateway6 = api.Gateway6(n.Subnet6)
	n.NAT66, n.RouterAdvertisement = true, true
	return n
}

// g6VM is a VM namespace whose eth0 (with mac) is the guarded port
// p-<name> of n's bridge, isolated if n is.
func g6VM(t *testing.T, host *testutil.NS, n *api.Network, name, mac string) *testutil.NS {
	t.Helper()
	v := testutil.NewNS(t, "g6-"+name)
	port := "p-" + name
	testutil.Run(t, "ip", "-n", host.Name, "link", "add", port, "up", "type", "veth", "peer", "name", "eth0", "address", mac, "netns", v.Name)
	host.MustDo(t, func() error {
		if err := guard.AddPort(context.Background(), n, port, mustMAC(mac)); err != nil {
			return err
		}
		l, err := netlink.LinkByName(port)
		if err != nil {
			return err
		}
		return AttachPort(n.Bridge(), l, n.Isolation)
	})
	v.MustRun(t, "ip", "link", "set", "eth0", "up")
	return v
}

// g6Addr waits for v's eth0 to have an address of scope ("global" or
// "link") past duplicate address detection.
func g6Addr(t *testing.T, v *testutil.NS, scope string) netip.Addr {
	t.Helper()
	var a netip.Addr
	testutil.Eventually(t, 15*time.Second, func() error {
		out := v.MustRun(t, "ip", "-6", "-o", "addr", "show", "dev", "eth0", "scope", scope)
		f := strings.Fields(out)
		if len(f) < 4 || strings.Contains(out, "tentative") {
			return fmt.Errorf("%s: %q", v.Name, out)
		}
		a = netip.MustParsePrefix(f[3]).Addr()
		return nil
	}, "a "+scope+" IPv6 address")
	return a
}

// g6Drops is the drop counter of port p-<name>, read alone.
func g6Drops(t *testing.T, host *testutil.NS, n *api.Network, name string) uint64 {
	t.Helper()
	var drops map[string]uint64
	host.MustDo(t, func() (err error) {
		drops, err = guard.Drops(context.Background(), n.ID, []string{"p-" + name})
		return err
	})
	return drops["p-"+name]
}

// g6Fragments splits an ICMPv6 frame (Ethernet, IPv6 header, message) in
// two fragments, the first with first bytes of the message.
func g6Fragments(frame []byte, first int) [][]byte {
	hdr, msg := frame[:14+40], frame[14+40:]
	var out [][]byte
	for _, part := range [][2]int{{0, first}, {first, len(msg)}} {
		f := append([]byte(nil), hdr...)
		f[14+6] = 44 // next header: fragment
		fh := make([]byte, 8)
		fh[0] = 58
		off := uint16(part[0]/8) << 3
		if part[1] < len(msg) {
			off |= 1 // more fragments
		}
		binary.BigEndian.PutUint16(fh[2:], off)
		binary.BigEndian.PutUint32(fh[4:], 0x5eed)
		f = append(append(f, fh...), msg[part[0]:part[1]]...)
		binary.BigEndian.PutUint16(f[14+4:], uint16(8+part[1]-part[0]))
		out = append(out, f)
	}
	return out
}

// TestGuard6: what a hostile VM tries against another's IPv6 address gets
// dropped (a forged advertisement in fragments, a duplicate address
// detection that contests an owned address), and the bindings outlive a
// restart of the network's services: the VM keeps reaching its gateway,
// and no VM can take its address in between. A binding deleted behind
// the guard's back is put back.
func TestGuard6(t *testing.T) {
	needRoot(t)
	host := testutil.NewNS(t, "g6-host")
	n := g6Net()
	nw := start(t, host, n, Options{StateDir: t.TempDir(), Upstreams: []string{"127.0.0.1:53"}})
	macA, macB := "52:55:55:00:09:0a", "52:55:55:00:09:0b"
	a := g6VM(t, host, n, "a", macA)
	b := g6VM(t, host, n, "b", macB)
	gA := g6Addr(t, a, "global")
	llB := g6Addr(t, b, "link")
	bs := newRawSender(t, b)
	owner := func(nw *Network) string { o, _ := nw.guard6.Learner.Owner(gA); return o.String() }
	testutil.Eventually(t, 10*time.Second, func() error {
		if o := owner(nw); o != macA {
			return fmt.Errorf("owner of A's %s: %q", gA, o)
		}
		return nil
	}, "A's address to be bound to A")
	host.MustRun(t, "ping", "-c", "1", "-W", "2", gA.String()) // the host's neighbour entry for A

	forged := nd6Frame(t, mustMAC(macB), nd6AllNodesMAC, llB, allNodes, 255, ipv6.ICMPTypeNeighborAdvertisement, 0x20, gA, nd6LLA(2, mustMAC(macB)))
	for _, c := range []struct {
		name   string
		frames [][]byte
	}{
		{"advertisement in fragments", g6Fragments(forged, 8)},
		{"duplicate address detection of A's address", [][]byte{dadNS(t, mustMAC(macB), gA)}},
	} {
		before := g6Drops(t, host, n, "b")
		bs.Send(t, c.frames...)
		testutil.Eventually(t, 5*time.Second, func() error {
			if d := g6Drops(t, host, n, "b"); d == before {
				return fmt.Errorf("drops of b: %d", d)
			}
			return nil
		}, "the guard to drop B's "+c.name)
	}
	if out := host.MustRun(t, "ip", "-6", "neigh", "show", gA.String()); !strings.Contains(out, macA) {
		t.Errorf("the host's neighbour entry for A's %s: %q, want A's MAC", gA, out)
	}

	// A flood of neighbour solicitations for the gateway from addresses
	// nobody owns (each would cost the host a neighbour entry): only the
	// rate limit's worth passes; A still reaches its gateway.
	sn, snm := solicitedNode(n.Gateway6)
	flood := make([][]byte, 400)
	for i := range flood {
		src := netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x99, 14: byte(0x10 + i>>8), 15: byte(i)})
		flood[i] = nd6Frame(t, mustMAC(macB), snm, src, sn, 255, ipv6.ICMPTypeNeighborSolicitation, 0, n.Gateway6, nd6LLA(1, mustMAC(macB)))
	}
	before := g6Drops(t, host, n, "b")
	bs.Send(t, flood...)
	testutil.Eventually(t, 5*time.Second, func() error {
		if d := g6Drops(t, host, n, "b"); d < before+300 {
			return fmt.Errorf("drops of b: %d, want %d or more", d, before+300)
		}
		return nil
	}, "the guard to drop the flood beyond its rate")
	if out := host.MustRun(t, "ip", "-6", "neigh", "show", "dev", n.Bridge()); strings.Count(out, "\n") > 100 {
		t.Errorf("the host has %d neighbour entries on the bridge after the flood, want the rate limit's worth", strings.Count(out, "\n"))
	}
	if _, err := a.Run(context.Background(), "ping", "-c", "1", "-W", "3", n.Gateway6.String()); err != nil {
		t.Errorf("A cannot reach its gateway after B's flood: %v", err)
	}

	// A restart: the bindings carry over, so A's traffic flows at once and
	// B's claim of A's address in between goes nowhere.
	nw.Close()
	nw2 := start(t, host, n, Options{StateDir: t.TempDir(), Upstreams: []string{"127.0.0.1:53"}})
	if o := owner(nw2); o != macA {
		t.Errorf("after a restart, A's %s is bound to %q, want A's MAC", gA, o)
	}
	before = g6Drops(t, host, n, "b")
	bs.Send(t, forged)
	testutil.Eventually(t, 5*time.Second, func() error {
		if d := g6Drops(t, host, n, "b"); d == before {
			return fmt.Errorf("drops of b: %d", d)
		}
		return nil
	}, "the guard to drop B's advertisement of A's address after the restart")
	if _, err := a.Run(context.Background(), "ping", "-c", "1", "-W", "3", n.Gateway6.String()); err != nil {
		t.Errorf("A cannot reach its gateway right after a restart: %v", err)
	}
	if o := owner(nw2); o != macA {
		t.Errorf("B took A's %s after the restart: bound to %s", gA, o)
	}

	// A binding deleted from the sets behind the guard's back comes back,
	// also after a sync that found them right (and trusts them while the
	// nftables generation stands: a second read at the same generation
	// confirmed the first, a third trusts them).
	// (The sleep is the rule's own gap between two reads, guard.TrustGap,
	// not a wait for anything.)
	for i := range 3 {
		if i == 1 {
			time.Sleep(guard.TrustGap)
		}
		host.MustDo(t, func() error { return nw2.guard6.Sync(context.Background()) })
	}
	host.MustRun(t, "nft", "delete", "element", "bridge", hostnet.TableName(n.ID), guard.SetAddrs6, "{", macA, ".", gA.String(), "}")
	host.MustDo(t, func() error { return nw2.guard6.Sync(context.Background()) })
	if out := host.MustRun(t, "nft", "list", "set", "bridge", hostnet.TableName(n.ID), guard.SetAddrs6); !strings.Contains(out, gA.String()) {
		t.Errorf("after a sync, addrs6 lacks A's %s:\n%s", gA, out)
	}
}

// TestReservationsInGuard: a VM's reserved EUI-64 addresses are in the
// guard's sets, marked as reservations: a restarted network does not take
// them for addresses the VM was heard using (DNS would answer them, for a
// VM that may never use them), and they go when the VM goes.
func TestReservationsInGuard(t *testing.T) {
	needRoot(t)
	host := testutil.NewNS(t, "rs-host")
	n := g6Net()
	opts := Options{StateDir: t.TempDir(), Upstreams: []string{"127.0.0.1:53"}}
	nw := start(t, host, n, opts)
	ghost := mustMAC("52:55:55:00:09:0c") // defined, never booted
	gll := api.LinkLocal(ghost).Addr()
	if err := nw.SetHost(ghost, "ghost", netip.Addr{}); err != nil {
		t.Fatal(err)
	}
	nw.SetVMs([]string{"ghost"}, []net.HardwareAddr{ghost})
	addrs6 := func() string {
		return host.MustRun(t, "nft", "list", "set", "bridge", hostnet.TableName(n.ID), guard.SetAddrs6)
	}
	if out := addrs6(); !strings.Contains(out, ghost.String()+" . "+gll.String()+` comment "reserved"`) {
		t.Fatalf("the reserved link-local address is not in the guard as a reservation:\n%s", out)
	}
	// Written through netlink, read as nft writes it: the target as the
	// raw 128 bits of a neighbour advertisement's target.
	if out := host.MustRun(t, "nft", "list", "set", "bridge", hostnet.TableName(n.ID), guard.SetTargets6); !strings.Contains(out, ghost.String()+" . "+ip6Int(gll)+` comment "reserved"`) {
		t.Fatalf("the reservation is not in targets6 as nft writes it:\n%s", out)
	}
	if out := host.MustRun(t, "nft", "list", "set", "bridge", hostnet.TableName(n.ID), guard.SetOwnedT6); !strings.Contains(out, ip6Int(gll)) {
		t.Fatalf("the reserved address is not in ownedt6 as nft writes it:\n%s", out)
	}
	nw.Close()

	nw = start(t, host, n, opts)
	if got := nw.guard6.Learner.Lookup(ghost); len(got) > 0 {
		t.Errorf("after a restart the reservations are taken for addresses the VM uses: %v", got)
	}
	if err := nw.SetHost(ghost, "ghost", netip.Addr{}); err != nil {
		t.Fatal(err)
	}
	nw.SetVMs([]string{"ghost"}, []net.HardwareAddr{ghost})
	if out := addrs6(); !strings.Contains(out, gll.String()) {
		t.Fatalf("the reservation is not back after the restart:\n%s", out)
	}
	// The VM goes, in a round that tells of what changed (a controller's
	// detach): its name is no longer the state dir's, its reservations go
	// from the learner at once, and from the guard in the sync that
	// follows (removalDelay).
	if !nw.hosts.isReserved("Ghost") {
		t.Errorf("the VM file's name is not reserved")
	}
	nw.ChangeVMs(nil, []string{"ghost"}, []net.HardwareAddr{ghost})
	if r := nw.guard6.Learner.Reserved(); len(r) > 0 {
		t.Errorf("reservations of a VM that went: %v", r)
	}
	if _, ok := nw.hosts.mac("ghost"); ok || nw.hosts.isReserved("ghost") {
		t.Errorf("the name of a VM that went is still its or reserved")
	}
	nw.ChangeVMs([]string{"Other"}, nil, nil)
	if !nw.hosts.isReserved("other") {
		t.Errorf("a name added is not reserved")
	}
	testutil.Eventually(t, 30*time.Second, func() error {
		if out := addrs6(); strings.Contains(out, gll.String()) {
			return fmt.Errorf("the guard still holds the reservation of a VM that went:\n%s", out)
		}
		return nil
	}, "the reservation leaves the guard")
	nw.Close()
}

// ip6Int is an IPv6 address as nft writes a 128-bit raw payload.
func ip6Int(a netip.Addr) string {
	b := a.As16()
	return "0x" + hex.EncodeToString(b[:])
}

// TestReservationsMany: the reservations of 600 VMs at once (a
// controller's first pass over a fleet), and their removal (a `down`),
// reach the guard's sets: eight thousand writes, more than one netlink
// message carries ("message too long" before they were sent in chunks).
func TestReservationsMany(t *testing.T) {
	needRoot(t)
	host := testutil.NewNS(t, "rm-host")
	n := g6Net()
	nw := start(t, host, n, Options{StateDir: t.TempDir(), Upstreams: []string{"127.0.0.1:53"}})
	var macs []net.HardwareAddr
	var names []string
	for i := range 600 {
		mac := mustMAC(fmt.Sprintf("52:55:56:00:%02x:%02x", i/256, i%256))
		name := fmt.Sprintf("vm%d", i)
		if err := nw.SetHost(mac, name, netip.Addr{}); err != nil {
			t.Fatal(err)
		}
		macs, names = append(macs, mac), append(names, name)
	}
	nw.SetVMs(names, macs)
	count := func() int {
		return strings.Count(host.MustRun(t, "nft", "list", "set", "bridge", hostnet.TableName(n.ID), guard.SetAddrs6), `comment "reserved"`)
	}
	if got := count(); got != 2*len(macs) {
		t.Fatalf("%d reservations in the guard, want %d", got, 2*len(macs))
	}
	nw.SetVMs(nil, nil)
	testutil.Eventually(t, 30*time.Second, func() error {
		if got := count(); got != 0 {
			return fmt.Errorf("%d reservations left", got)
		}
		return nil
	}, "the reservations of the VMs that went leave the guard")
}

// TestReservationsBesideSyncs: the reservations of VMs that come while
// the guard's sync runs again and again beside them (SyncReservedOf does
// not wait for a sync; at least one sync between one VM and the next)
// are in the guard once each round that reserved them has ended, and
// stay: a sync never takes out what the learner reserves, whichever of
// them reads or writes first.
func TestReservationsBesideSyncs(t *testing.T) {
	needRoot(t)
	host := testutil.NewNS(t, "rb-host")
	n := g6Net()
	nw := start(t, host, n, Options{StateDir: t.TempDir(), Upstreams: []string{"127.0.0.1:53"}})
	stop, done := make(chan struct{}), make(chan struct{})
	var syncs atomic.Int64
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if nw.guard6.Sync(context.Background()) == nil {
				syncs.Add(1)
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done }) // (before the network's Close)
	reserved := func(mac net.HardwareAddr) bool {
		t.Helper()
		ll := api.LinkLocal(mac).Addr().As16()
		key := append(append(append([]byte{}, mac...), 0, 0), ll[:]...)
		var ok bool
		host.MustDo(t, func() (err error) { ok, err = hostnet.HasElement(n.ID, guard.SetAddrs6, key); return err })
		return ok
	}
	var macs []net.HardwareAddr
	for i := range 40 {
		// A sync more between one VM and the next, however slow the
		// machine: they interleave.
		was := syncs.Load()
		testutil.Eventually(t, time.Minute, func() error {
			if syncs.Load() == was {
				return fmt.Errorf("%d syncs", was)
			}
			return nil
		}, "a sync beside the reservations")
		mac := mustMAC(fmt.Sprintf("52:55:57:00:00:%02x", i))
		name := fmt.Sprintf("rb%d", i)
		if err := nw.SetHost(mac, name, netip.Addr{}); err != nil {
			t.Fatal(err)
		}
		nw.ChangeVMs([]string{name}, nil, nil) // as a pass asked for ends its round
		macs = append(macs, mac)
		for _, m := range macs {
			if !reserved(m) {
				t.Fatalf("after %d VMs and %d syncs beside them, %s's reservation is not in the guard", i+1, syncs.Load(), m)
			}
		}
	}
}

// TestReservationsAfterSetsGo: the guard keeps its sets' descriptions
// from the first reservation it writes; when the table goes behind its
// back, the next VM's reservation makes the sets again and lands there,
// not lost on the sets it knew.
func TestReservationsAfterSetsGo(t *testing.T) {
	needRoot(t)
	host := testutil.NewNS(t, "rg-host")
	n := g6Net()
	nw := start(t, host, n, Options{StateDir: t.TempDir(), Upstreams: []string{"127.0.0.1:53"}})
	addrs6 := func() string {
		return host.MustRun(t, "nft", "list", "set", "bridge", hostnet.TableName(n.ID), guard.SetAddrs6)
	}
	a, b := mustMAC("52:55:55:00:09:1a"), mustMAC("52:55:55:00:09:1b")
	if err := nw.SetHost(a, "a", netip.Addr{}); err != nil {
		t.Fatal(err)
	}
	nw.ChangeVMs([]string{"a"}, nil, nil)
	if out := addrs6(); !strings.Contains(out, api.LinkLocal(a).Addr().String()) {
		t.Fatalf("a's reservation is not in the guard:\n%s", out)
	}
	host.MustRun(t, "nft", "delete", "table", "bridge", hostnet.TableName(n.ID))
	if err := nw.SetHost(b, "b", netip.Addr{}); err != nil {
		t.Fatal(err)
	}
	nw.ChangeVMs([]string{"b"}, nil, nil)
	if out := addrs6(); !strings.Contains(out, api.LinkLocal(b).Addr().String()) {
		t.Fatalf("after the table went, b's reservation is not in the guard:\n%s", out)
	}
}
