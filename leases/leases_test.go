package leases

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// testNet and mustMAC are the fixtures of testutil.
var (
	testNet = testutil.Network
	mustMAC = testutil.MAC
)

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

// mustAllocator is NewAllocator(n, path) that fails the test on error.
func mustAllocator(tb testing.TB, n *api.Network, path string) *Allocator {
	tb.Helper()
	a, err := NewAllocator(n, path)
	if err != nil {
		tb.Fatal(err)
	}
	return a
}

func lease(t *testing.T, a *Allocator, mac string) netip.Addr {
	t.Helper()
	hw := mustMAC(mac)
	off, err := a.Offer(hw, netip.Addr{})
	if err != nil {
		t.Fatalf("offer to %s: %v", mac, err)
	}
	l, err := a.Commit(hw, off, "")
	if err != nil {
		t.Fatalf("commit %s to %s: %v", off, mac, err)
	}
	return l.IP
}

func TestAllocatorPersistsAndReuses(t *testing.T) {
	n := testNet("t", api.ModeShared, "10.9.0.0/24")
	n.Reservations = []api.Reservation{{MAC: "52:55:55:00:00:99", IP: ip("10.9.0.50")}}
	path := filepath.Join(t.TempDir(), "t.leases.json")
	a := mustAllocator(t, n, path)
	now := time.Unix(1_800_000_000, 0)
	a.now = func() time.Time { return now }
	if got := lease(t, a, "52:55:55:00:00:01"); got != ip("10.9.0.2") {
		t.Errorf("first client got %s, want 10.9.0.2", got)
	}
	if got := lease(t, a, "52:55:55:00:00:99"); got != ip("10.9.0.50") {
		t.Errorf("reserved client got %s, want 10.9.0.50", got)
	}
	if err := a.Release(mustMAC("52:55:55:00:00:01")); err != nil {
		t.Fatal(err)
	}

	// A new allocator on the same file: a released address is remembered
	// for its MAC and a new client gets a never-used one.
	b := mustAllocator(t, n, path)
	b.now = a.now
	if got := lease(t, b, "52:55:55:00:00:02"); got != ip("10.9.0.3") {
		t.Errorf("new client after restart got %s, want 10.9.0.3", got)
	}
	if got := lease(t, b, "52:55:55:00:00:01"); got != ip("10.9.0.2") {
		t.Errorf("old client after restart got %s, want its 10.9.0.2", got)
	}
	// A request for someone else's address is refused (NAK).
	if _, err := b.Commit(mustMAC("52:55:55:00:00:03"), ip("10.9.0.2"), ""); err == nil {
		t.Error("committing another client's address succeeded")
	}
	// A run-time fixed address moves a client; it cannot take a reservation.
	if err := b.SetFixed(mustMAC("52:55:55:00:00:02"), ip("10.9.0.200")); err != nil {
		t.Fatal(err)
	}
	if got := lease(t, b, "52:55:55:00:00:02"); got != ip("10.9.0.200") {
		t.Errorf("fixed client got %s, want 10.9.0.200", got)
	}
	if err := b.SetFixed(mustMAC("52:55:55:00:00:04"), ip("10.9.0.50")); err == nil {
		t.Error("fixing a reserved address for another MAC succeeded")
	}
	if err := b.SetFixed(mustMAC("52:55:55:00:00:04"), ip("10.9.0.1")); err == nil {
		t.Error("fixing the gateway succeeded")
	}
	// Atomic writes leave the lease file and its journal, nothing else.
	if ents, err := os.ReadDir(filepath.Dir(path)); err != nil || len(ents) != 2 || ents[0].Name() != "t.leases.json" || ents[1].Name() != "t.leases.json.journal" {
		t.Errorf("state dir holds %v (%v), want only t.leases.json and its journal", ents, err)
	}
	if got := len(b.Leases()); got != 3 {
		t.Errorf("%d leases, want 3: %v", got, b.Leases())
	}
	// Expired leases are reused for others only when nothing else is left.
	now = now.Add(2 * time.Minute)
	if got := len(b.Leases()); got != 0 {
		t.Errorf("%d unexpired leases after expiry, want 0", got)
	}
}

func TestAllocatorExhaustion(t *testing.T) {
	n := testNet("t", api.ModeHost, "10.9.0.0/29") // .1 gateway, .2-.6 range
	n.DHCPEnd = ip("10.9.0.3")
	a := mustAllocator(t, n, "")
	now := time.Unix(1_800_000_000, 0)
	a.now = func() time.Time { return now }
	lease(t, a, "52:55:55:00:00:01")
	lease(t, a, "52:55:55:00:00:02")
	if _, err := a.Offer(mustMAC("52:55:55:00:00:03"), netip.Addr{}); !errors.Is(err, ErrNoAddress) {
		t.Fatalf("offer with a full range: %v, want ErrNoAddress", err)
	}
	now = now.Add(time.Hour)
	if got := lease(t, a, "52:55:55:00:00:03"); got != ip("10.9.0.2") {
		t.Errorf("after expiry got %s, want the oldest expired 10.9.0.2", got)
	}
}

// TestAllocatorHoldsOffers: clients that discover at once are offered
// different addresses, and each can take its own; an offer not taken is
// free again after offerHold; a flood of DISCOVERs holds at most maxOffers.
func TestAllocatorHoldsOffers(t *testing.T) {
	n := testNet("t", api.ModeHost, "10.9.0.0/24")
	a := mustAllocator(t, n, "")
	now := time.Unix(1_800_000_000, 0)
	a.now = func() time.Time { return now }
	m1, m2 := mustMAC("52:55:55:00:00:01"), mustMAC("52:55:55:00:00:02")
	o1, err1 := a.Offer(m1, netip.Addr{})
	o2, err2 := a.Offer(m2, netip.Addr{})
	if err1 != nil || err2 != nil || o1 == o2 {
		t.Fatalf("two clients discovering at once were offered %s (%v) and %s (%v), want two addresses", o1, err1, o2, err2)
	}
	// The second asks for the first's address: not while it is held.
	if o, _ := a.Offer(m2, o1); o == o1 {
		t.Errorf("an address offered to %s was offered to %s as well", m1, m2)
	}
	for _, c := range []struct {
		mac net.HardwareAddr
		ip  netip.Addr
	}{{m2, o2}, {m1, o1}} {
		if _, err := a.Commit(c.mac, c.ip, ""); err != nil {
			t.Errorf("%s requesting its offer %s: %v", c.mac, c.ip, err)
		}
	}
	// An offer not taken is held for offerHold only.
	m3, m4 := mustMAC("52:55:55:00:00:03"), mustMAC("52:55:55:00:00:04")
	o3, _ := a.Offer(m3, netip.Addr{})
	if o, _ := a.Offer(m4, o3); o == o3 {
		t.Errorf("%s was offered %s, held for %s", m4, o3, m3)
	}
	now = now.Add(offerHold)
	if o, _ := a.Offer(m4, o3); o != o3 {
		t.Errorf("after the hold, %s asking for %s was offered %s", m4, o3, o)
	}
	// A flood of DISCOVERs holds no more than maxOffers.
	big := testNet("big", api.ModeHost, "10.8.0.0/16")
	b := mustAllocator(t, big, "")
	b.now = a.now
	for i := range 3 * maxOffers {
		if _, err := b.Offer(net.HardwareAddr{0x52, 0x55, 0x55, 0xee, byte(i >> 8), byte(i)}, netip.Addr{}); err != nil {
			t.Fatal(err)
		}
	}
	if len(b.offers) > maxOffers || len(b.offered) > maxOffers {
		t.Errorf("%d offers held (%d addresses), want at most %d", len(b.offers), len(b.offered), maxOffers)
	}
}

func TestAllocatorDecline(t *testing.T) {
	n := testNet("t", api.ModeShared, "10.9.0.0/24")
	a := mustAllocator(t, n, "")
	mac := "52:55:55:00:00:01"
	first := lease(t, a, mac)
	if err := a.Decline(mustMAC(mac), first); err != nil {
		t.Fatal(err)
	}
	if got := lease(t, a, mac); got == first {
		t.Errorf("after DECLINE of %s the client got it again", first)
	}
	if got := lease(t, a, "52:55:55:00:00:02"); got == first {
		t.Errorf("a declined address %s was given to another client", first)
	}
}

// TestUnreadableLeaseFile: a lease file that cannot be read (truncated)
// does not keep its network from starting (issue 32: it stayed in error
// until someone deleted the file): it is set aside, and the leases its
// journal holds are kept, on disk too, through the next start.
func TestUnreadableLeaseFile(t *testing.T) {
	n := testNet("t", api.ModeShared, "10.9.0.0/24")
	path := filepath.Join(t.TempDir(), "t.leases.json")
	a := mustAllocator(t, n, path)
	lease(t, a, "52:55:55:00:00:01")        // the first write is the snapshot
	got := lease(t, a, "52:55:55:00:00:02") // then the journal
	a.Close()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data[:len(data)/2], 0o644); err != nil { // truncated
		t.Fatal(err)
	}
	if ls, err := Read(path, time.Now()); err != nil || len(ls) != 1 || ls[0].IP != got {
		t.Errorf("Read of a truncated lease file: %+v, %v; want the journal's lease of %s", ls, err, got)
	}
	b, err := NewAllocator(n, path)
	if err != nil {
		t.Fatalf("a truncated lease file keeps the network from starting: %v", err)
	}
	if why := b.SetAside(); !strings.Contains(why, path+".unreadable") {
		t.Errorf("SetAside = %q, want it to name where the file went", why)
	}
	if _, err := os.Stat(path + ".unreadable"); err != nil {
		t.Errorf("the unreadable file was not set aside: %v", err)
	}
	b.Close()
	c, err := NewAllocator(n, path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if l, ok := c.Lookup(mustMAC("52:55:55:00:00:02")); !ok || l.IP != got {
		t.Errorf("the next start: the lease is %+v, %v; want %s (from the journal)", l, ok, got)
	}
	if why := c.SetAside(); why != "" {
		t.Errorf("the next start: the new lease file could not be read: %s", why)
	}
}

// TestKeptWhileAttached: the lease of a VM that is attached (SetPresent)
// is kept past its expiry: it stays bound (the guard lets the VM send from
// it), is listed, and is offered to no one else while another address is
// left; with none left, the one that expired longest ago goes to a new
// client, and the VM loses it. A lease of a VM no longer attached expires
// as before.
func TestKeptWhileAttached(t *testing.T) {
	n := testNet("t", api.ModeHost, "10.9.0.0/29") // .1 gateway
	n.DHCPEnd = ip("10.9.0.3")                     // range .2-.3
	n.LeaseTime = time.Minute
	a := mustAllocator(t, n, "")
	now := time.Unix(1_800_000_000, 0)
	a.now = func() time.Time { return now }
	vm, other, third := mustMAC("52:55:55:00:01:01"), mustMAC("52:55:55:00:01:02"), mustMAC("52:55:55:00:01:03")
	if got := lease(t, a, vm.String()); got != ip("10.9.0.2") {
		t.Fatalf("the VM got %s", got)
	}
	a.SetPresent(vm, true)
	now = now.Add(10 * time.Minute) // long expired
	if got := a.BoundTo(vm); len(got) != 1 || got[0] != ip("10.9.0.2") {
		t.Errorf("an attached VM's expired lease: bound %v, want 10.9.0.2", got)
	}
	if l, ok := a.Lookup(vm); !ok || l.IP != ip("10.9.0.2") || len(a.Leases()) != 1 {
		t.Errorf("an attached VM's expired lease is not listed: %v %v, %v", l, ok, a.Leases())
	}
	// Another client gets the address left, not the VM's.
	if got := lease(t, a, other.String()); got != ip("10.9.0.3") {
		t.Errorf("another client got %s, want 10.9.0.3 (the VM's is kept)", got)
	}
	// The VM renews and keeps it.
	if _, err := a.Commit(vm, ip("10.9.0.2"), ""); err != nil {
		t.Errorf("the VM's renewal: %v", err)
	}
	// Both expire; the other client's VM is not attached.
	now = now.Add(10 * time.Minute)
	if got := a.BoundTo(other); len(got) != 0 {
		t.Errorf("a detached client's expired lease is bound: %v", got)
	}
	// A third client: the other's expired address first.
	if got := lease(t, a, third.String()); got != ip("10.9.0.3") {
		t.Errorf("a third client got %s, want the detached client's 10.9.0.3", got)
	}
	// A fourth, with nothing left but the VM's kept lease: it takes it.
	fourth := mustMAC("52:55:55:00:01:04")
	if got := lease(t, a, fourth.String()); got != ip("10.9.0.2") {
		t.Errorf("a client with no address left got %s, want the kept 10.9.0.2", got)
	}
	if got := a.BoundTo(vm); len(got) != 0 {
		t.Errorf("the VM still holds %v after its address went to another client", got)
	}
	// Detached, an expired lease goes at once.
	a.SetPresent(fourth, true)
	now = now.Add(10 * time.Minute)
	if len(a.BoundTo(fourth)) != 1 {
		t.Fatal("an attached VM's expired lease is not bound")
	}
	a.SetPresent(fourth, false)
	if got := a.BoundTo(fourth); len(got) != 0 {
		t.Errorf("a detached VM's expired lease is bound: %v", got)
	}
}

// TestReleasedNotKept: an attached VM that released its address (DHCP
// RELEASE) gave it back: it is not kept past the release.
func TestReleasedNotKept(t *testing.T) {
	n := testNet("t", api.ModeHost, "10.9.0.0/24")
	a := mustAllocator(t, n, "")
	now := time.Unix(1_800_000_000, 0)
	a.now = func() time.Time { return now }
	vm := mustMAC("52:55:55:00:02:01")
	lease(t, a, vm.String())
	a.SetPresent(vm, true)
	if err := a.Release(vm); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Second)
	if got := a.BoundTo(vm); len(got) != 0 {
		t.Errorf("a released address is still bound: %v", got)
	}
}

// TestFixedWinsOverLease: an address fixed for a VM after another MAC got
// a lease on it (a network's start, before the controller told it the
// files) is bound to the VM alone.
func TestFixedWinsOverLease(t *testing.T) {
	n := testNet("t", api.ModeHost, "10.9.0.0/24")
	a := mustAllocator(t, n, "")
	other, vm := mustMAC("52:55:55:00:03:01"), mustMAC("52:55:55:00:03:02")
	got := lease(t, a, other.String())
	a.SetPresent(other, true)
	if err := a.SetFixed(vm, got); err != nil {
		t.Fatal(err)
	}
	if b := a.BoundTo(other); len(b) != 0 {
		t.Errorf("the lease's MAC is still bound to %v, now %s's fixed address", b, vm)
	}
	if b := a.BoundTo(vm); len(b) != 1 || b[0] != got {
		t.Errorf("the VM is bound to %v, want %s", b, got)
	}
}
