// The lease store's fuzzers: arbitrary lease files and journals.

package leases

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// The fuzzers' networks and clock (testutil.FuzzNetwork).
var (
	fuzzNet      = testutil.FuzzNetwork
	fuzzNow      = testutil.FuzzNow
	fuzzFixedMAC = testutil.FuzzFixedMAC
)

// checkHandOut fails when addr may not be given to mac by a's network n:
// mac's fixed address exactly if it has one; else an address of the DHCP
// range that is not the network, broadcast or gateway address, not fixed
// for another MAC, not leased (unexpired) to another MAC and not declined.
func checkHandOut(t *testing.T, n *api.Network, a *Allocator, mac string, addr netip.Addr) {
	t.Helper()
	if f, ok := a.fixed[mac]; ok {
		if addr != f {
			t.Fatalf("%s has the fixed address %s but was given %s", mac, f, addr)
		}
		return
	}
	switch {
	case !addr.IsValid() || addr.Less(n.DHCPStart) || n.DHCPEnd.Less(addr):
		t.Fatalf("%s was given %s, outside the DHCP range %s-%s", mac, addr, n.DHCPStart, n.DHCPEnd)
	case addr == n.Subnet.Masked().Addr():
		t.Fatalf("%s was given the network address %s", mac, addr)
	case addr == lastAddr(n.Subnet):
		t.Fatalf("%s was given the broadcast address %s", mac, addr)
	case addr == n.Gateway:
		t.Fatalf("%s was given the gateway address %s", mac, addr)
	}
	for m, f := range a.fixed {
		if f == addr && m != mac {
			t.Fatalf("%s was given %s, fixed for %s", mac, addr, m)
		}
	}
	for m, l := range a.leases {
		if l.IP == addr && m != mac && fuzzNow.Before(l.Expiry) {
			t.Fatalf("%s was given %s, leased to %s until %s", mac, addr, m, l.Expiry)
		}
	}
	if until, ok := a.declined[addr]; ok && fuzzNow.Before(until) {
		t.Fatalf("%s was given %s, declined until %s", mac, addr, until)
	}
}

// checkLeases fails when two unexpired leases share an address.
func checkLeases(t *testing.T, a *Allocator) {
	t.Helper()
	seen := map[netip.Addr]string{}
	for _, l := range a.Leases() {
		if m, dup := seen[l.IP]; dup {
			t.Fatalf("%s is leased to both %s and %s", l.IP, m, l.MAC)
		}
		seen[l.IP] = l.MAC
	}
}

// FuzzLeaseFile loads arbitrary lease files, then hands out addresses to
// the MACs of the file, to new MACs and to the reserved MAC until the range
// runs out. Loading does not panic, every lease kept is usable, and every
// address handed out afterwards is the MAC's fixed address or one of the
// DHCP range, never the network, broadcast or gateway address nor another
// MAC's; what the allocator saved loads back the same.
func FuzzLeaseFile(f *testing.F) {
	f.Add(byte(0), []byte(`{"network":"f","leases":[{"mac":"52:55:55:00:00:01","ip":"10.9.0.120","expiry":"2030-01-01T01:00:00Z"}]}`))
	f.Add(byte(0), []byte(`{"leases":[{"mac":"zz","ip":"10.9.0.1"},{"mac":"52:55:55:00:00:01","ip":"1.2.3.4"},`+
		`{"mac":"52:55:55:00:00:02","ip":"10.9.0.20","expiry":"2031-01-01T00:00:00Z"},{"mac":"52:55:55:00:00:03","ip":"10.9.0.50"}]}`))
	f.Add(byte(1), []byte(`{"leases":[{"mac":"52:55:55:00:00:01","ip":"10.9.1.0","expiry":"2031-01-01T00:00:00Z"},`+
		`{"mac":"52:55:55:00:00:02","ip":"10.9.1.7","expiry":"2031-01-01T00:00:00Z"},{"mac":"52:55:55:00:00:03","ip":"10.9.1.1"},`+
		`{"mac":"52-55-55-00-00-04","ip":"10.9.1.2","expiry":"2031-01-01T00:00:00Z","hostname":"a"},{"mac":"52:55:55:00:00:04","ip":"10.9.1.3"}]}`))
	f.Add(byte(1), []byte(`{"leases":[{"mac":"52:55:55:00:00:01","ip":"10.9.1.4","expiry":"2031-01-01T00:00:00Z"},`+
		`{"mac":"52:55:55:00:00:02","ip":"10.9.1.4","expiry":"2031-01-01T00:00:00Z"}]}`))
	f.Add(byte(0), []byte(`not json`))
	// One file, rewritten for every input: a directory per input costs
	// more than the allocator itself.
	path := filepath.Join(f.TempDir(), "f.leases.json")
	f.Fuzz(func(t *testing.T, cfg byte, b []byte) { fuzzLeases(t, cfg, path, b, nil) })
}

// FuzzLeaseJournal loads a lease file with an arbitrary journal beside it,
// then checks what FuzzLeaseFile checks: a torn or corrupt record ends the
// journal, never the load; what is loaded keeps one lease per MAC and per
// address; and what is committed afterwards loads back.
func FuzzLeaseJournal(f *testing.F) {
	snap := []byte(`{"network":"f","seq":2,"leases":[{"mac":"52:55:55:00:00:01","ip":"10.9.0.120","expiry":"2030-01-01T01:00:00Z"}]}`)
	rec := func(seq uint64, op, mac, ip string) []byte {
		return appendRecord(nil, journalRecord{Seq: seq, Op: op, Lease: Lease{MAC: mac, IP: netip.MustParseAddr(ip), Expiry: fuzzNow.Add(time.Hour)}})
	}
	good := slices.Concat(rec(1, journalSet, "52:55:55:00:00:07", "10.9.0.121"), rec(3, journalSet, "52:55:55:00:00:02", "10.9.0.120"),
		rec(4, journalDrop, "52:55:55:00:00:01", "10.9.0.120"), rec(5, journalSet, "52:55:55:00:00:03", "10.9.0.1"),
		rec(6, journalSet, "52:55:55:00:00:02", "10.9.0.122"))
	f.Add(byte(0), snap, good)
	f.Add(byte(0), snap, good[:len(good)-7])
	f.Add(byte(1), snap, append(slices.Clone(good), "0000000 {}\nxyz"...))
	f.Add(byte(0), []byte(`{"leases":[]}`), []byte("deadbeef {\"seq\":1,\"op\":\"set\"}\n"))
	path := filepath.Join(f.TempDir(), "f.leases.json")
	f.Fuzz(func(t *testing.T, cfg byte, b, j []byte) { fuzzLeases(t, cfg, path, b, j) })
}

func fuzzLeases(t *testing.T, cfg byte, path string, b, journal []byte) {
	n := fuzzNet(cfg)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(JournalPath(path), journal, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(path, fuzzNow); err != nil && !strings.Contains(err.Error(), path) {
		t.Fatalf("ReadLeases: %v", err)
	}
	a, err := NewAllocator(n, path)
	if err != nil {
		// A file it cannot read is an error, not a crash or a guess.
		if !strings.Contains(err.Error(), "reading leases") {
			t.Fatalf("NewAllocator: %v", err)
		}
		return
	}
	defer a.Close()
	a.SetClock(func() time.Time { return fuzzNow })
	checkLeases(t, a) // a file's duplicate addresses are not kept
	var macs []string
	for m, l := range a.leases {
		if !a.usable(l.IP) || m != l.MAC {
			t.Fatalf("kept unusable lease %+v", l)
		}
		macs = append(macs, m)
	}
	slices.Sort(macs)
	macs = append(macs, fuzzFixedMAC)
	for i := range 8 {
		macs = append(macs, fmt.Sprintf("52:55:55:00:01:%02x", i))
	}
	for _, m := range macs {
		hw := mustMAC(m)
		off, err := a.Offer(hw, netip.Addr{})
		if errors.Is(err, ErrNoAddress) {
			continue
		}
		if err != nil {
			t.Fatalf("offer to %s: %v", m, err)
		}
		checkHandOut(t, n, a, m, off)
		l, err := a.Commit(hw, off, "")
		if err != nil {
			t.Fatalf("commit of the offered %s to %s: %v", off, m, err)
		}
		if l.IP != off {
			t.Fatalf("committed %s, offered %s", l.IP, off)
		}
	}
	again, err := NewAllocator(n, path)
	if err != nil {
		t.Fatalf("loading what was saved: %v", err)
	}
	defer again.Close()
	for m, l := range a.leases {
		if o, ok := again.leases[m]; !ok || o.IP != l.IP || o.Hostname != l.Hostname || !o.Expiry.Equal(l.Expiry) {
			t.Fatalf("lease %+v saved, loaded back as %+v", l, o)
		}
	}
	if len(again.leases) != len(a.leases) {
		t.Fatalf("%d leases saved, %d loaded back", len(a.leases), len(again.leases))
	}
}
