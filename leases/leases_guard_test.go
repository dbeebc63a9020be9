package leases

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
)

// guardNow is the injected clock of the guard tests.
var guardNow = time.Unix(1_800_000_000, 0)

// bigAllocator returns an allocator of a /16 whose lease file holds n
// unexpired leases on the first n addresses of the range, loaded the way
// vmnetctl loads them after a restart.
func bigAllocator(tb testing.TB, n int) *Allocator {
	tb.Helper()
	nw := testNet("big", api.ModeHost, "10.8.0.0/16")
	nw.LeaseTime = time.Hour
	f := leaseFile{Network: nw.ID, Subnet: nw.Subnet.String()}
	addr := nw.DHCPStart
	for i := range n {
		f.Leases = append(f.Leases, Lease{MAC: fmt.Sprintf("52:55:%02x:%02x:%02x:%02x", i>>24&0xff, i>>16&0xff, i>>8&0xff, i&0xff),
			IP: addr, Expiry: guardNow.Add(time.Hour)})
		addr = addr.Next()
	}
	data, err := json.Marshal(f)
	if err != nil {
		tb.Fatal(err)
	}
	path := filepath.Join(tb.TempDir(), "big.leases.json")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		tb.Fatal(err)
	}
	a := mustAllocator(tb, nw, path)
	a.now = func() time.Time { return guardNow }
	return a
}

// BenchmarkOffer measures a DISCOVER of a new VM on a /16 range that
// already holds many leases (60k: a nearly full range).
func BenchmarkOffer(b *testing.B) {
	for _, n := range []int{16_000, 60_000} {
		b.Run(fmt.Sprintf("leases=%d", n), func(b *testing.B) {
			a := bigAllocator(b, n)
			mac := mustMAC("52:56:00:00:00:01")
			b.ResetTimer()
			for b.Loop() {
				ip, err := a.Offer(mac, netip.Addr{})
				if err != nil {
					b.Fatal(err)
				}
				if !ip.IsValid() {
					b.Fatal("no address")
				}
			}
		})
	}
}

// checkIndex fails when a's index does not match its maps: one lease per
// address, the expiry heap, the fixed addresses, and the bit tree's every
// bit and summary level.
func checkIndex(t *testing.T, a *Allocator) {
	t.Helper()
	if len(a.byIP) != len(a.leases) {
		t.Fatalf("%d addresses indexed for %d leases", len(a.byIP), len(a.leases))
	}
	for m, l := range a.leases {
		if a.byIP[l.IP] != m || l.MAC != m {
			t.Fatalf("lease %+v of %s: byIP says %q", l, m, a.byIP[l.IP])
		}
		r, ok := a.refs[m]
		if ok != a.inRange(l.IP) {
			t.Fatalf("lease %+v: in the expiry heap %v, in the range %v", l, ok, a.inRange(l.IP))
		}
		if ok && (r.ip != l.IP || !r.exp.Equal(l.Expiry) || r.idx < 0 || r.idx >= len(a.byExpiry) || a.byExpiry[r.idx] != r) {
			t.Fatalf("lease %+v: heap entry %+v", l, r)
		}
	}
	if len(a.refs) != len(a.byExpiry) {
		t.Fatalf("%d heap refs, %d in the heap", len(a.refs), len(a.byExpiry))
	}
	for i := 1; i < len(a.byExpiry); i++ {
		if a.byExpiry.Less(i, (i-1)/2) {
			t.Fatalf("expiry heap out of order at %d", i)
		}
	}
	for m, ip := range a.fixed {
		if o := a.fixedIP[ip]; o != m && o != severalMACs {
			t.Fatalf("%s fixed for %s, fixedIP says %q", ip, m, o)
		}
	}
	for ip := range a.fixedIP {
		if !slices.Contains(slices.Collect(maps.Values(a.fixed)), ip) {
			t.Fatalf("fixedIP holds %s, fixed for no one", ip)
		}
	}
	for off := range a.size {
		ip := addrU32(a.base + off)
		_, leased := a.byIP[ip]
		_, fixed := a.fixedIP[ip]
		_, declined := a.declined[ip]
		if want := !a.usable(ip) || leased || fixed || declined; a.taken.has(off) != want {
			t.Fatalf("%s: taken %v, want %v (usable %v leased %v fixed %v declined %v)",
				ip, a.taken.has(off), want, a.usable(ip), leased, fixed, declined)
		}
	}
	checkTree(t, a.taken)
	for m, ips := range a.declines {
		if len(ips) > maxDeclinesPerMAC {
			t.Fatalf("%s keeps %d addresses in quarantine", m, len(ips))
		}
		for _, ip := range ips {
			if a.declinedBy[ip] != m {
				t.Fatalf("%s in %s's quarantine list, declined by %q", ip, m, a.declinedBy[ip])
			}
		}
	}
}

// checkTree fails when a summary bit of t is not "that word is full", a
// padding bit is clear, or next disagrees with a linear search.
func checkTree(t *testing.T, bt *bitTree) {
	t.Helper()
	meaningful := uint64(bt.n)
	for k, lv := range bt.levels {
		for i := meaningful; i < uint64(len(lv))*64; i++ {
			if lv[i/64]&(1<<(i%64)) == 0 {
				t.Fatalf("level %d: padding bit %d clear", k, i)
			}
		}
		if k > 0 {
			for j, w := range bt.levels[k-1] {
				if full, bit := w == ^uint64(0), lv[j/64]&(1<<(j%64)) != 0; full != bit {
					t.Fatalf("level %d bit %d is %v, word %d below full %v", k, j, bit, j, full)
				}
			}
		}
		meaningful = uint64(len(lv))
	}
	want, found := uint32(0), false
	for i := int64(bt.n) - 1; i >= -1; i-- { // from the end, so each i knows the next clear bit
		if i >= 0 && !bt.has(uint32(i)) {
			want, found = uint32(i), true
		}
		if i < 0 {
			break
		}
		got, ok := bt.next(uint32(i))
		if ok != found || (ok && got != want) {
			t.Fatalf("next(%d) = %d, %v; want %d, %v", i, got, ok, want, found)
		}
	}
}

func TestBitTree(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []uint32{0, 1, 63, 64, 65, 4095, 4096, 4097, 70_000} {
		bt := newBitTree(n)
		model := make([]bool, n)
		checkTree(t, bt)
		for range 3000 {
			if n == 0 {
				break
			}
			i := rng.Uint32N(n)
			if rng.IntN(3) > 0 { // fill up more often than not, so words get full
				bt.set(i)
				model[i] = true
			} else {
				bt.clear(i)
				model[i] = false
			}
		}
		for i := range n {
			if bt.has(i) != model[i] {
				t.Fatalf("n=%d: bit %d is %v, want %v", n, i, bt.has(i), model[i])
			}
		}
		checkTree(t, bt)
		// Fill every bit: nothing is found; clear the last: it is.
		for i := range n {
			bt.set(i)
		}
		checkTree(t, bt)
		if n > 0 {
			bt.clear(n - 1)
			if got, ok := bt.next(0); !ok || got != n-1 {
				t.Fatalf("n=%d: next(0) = %d, %v with only the last bit clear", n, got, ok)
			}
		}
	}
}

// TestAllocatorIndexInvariants runs random operations of many MACs over a
// small range and a slow clock, checking the index after each.
func TestAllocatorIndexInvariants(t *testing.T) {
	for _, cfg := range []byte{0, 1} {
		// A range within a /24 with a reservation outside it, and a /29
		// whose range is the whole subnet, network, gateway and broadcast
		// address included.
		n := testNet("i", api.ModeShared, "10.9.0.0/24")
		n.DHCPStart, n.DHCPEnd = ip("10.9.0.100"), ip("10.9.0.150")
		n.Reservations = []api.Reservation{{MAC: "52:55:55:00:02:07", IP: ip("10.9.0.20")}}
		if cfg == 1 {
			n = testNet("j", api.ModeHost, "10.9.1.0/29")
			n.DHCPStart, n.DHCPEnd = ip("10.9.1.0"), ip("10.9.1.7")
		}
		n.LeaseTime = 5 * time.Minute
		a := mustAllocator(t, n, "")
		now := guardNow
		a.now = func() time.Time { return now }
		rng := rand.New(rand.NewPCG(3, uint64(cfg)))
		mac := func() net.HardwareAddr { return mustMAC(fmt.Sprintf("52:55:55:00:02:%02x", rng.IntN(80))) }
		for i := range 5000 {
			m := mac()
			switch rng.IntN(8) {
			case 0, 1, 2:
				if off, err := a.Offer(m, netip.Addr{}); err == nil {
					if _, err := a.Commit(m, off, ""); err != nil {
						t.Fatalf("op %d: commit of the offered %s to %s: %v", i, off, m, err)
					}
				}
			case 3:
				req := addrU32(u32(n.DHCPStart) + rng.Uint32N(60))
				a.Commit(m, req, "")
			case 4:
				a.Decline(m, netip.Addr{})
			case 5:
				a.Release(m)
			case 6:
				if rng.IntN(2) == 0 {
					a.SetFixed(m, addrU32(u32(n.DHCPStart)+rng.Uint32N(10)))
				} else {
					a.ClearFixed(m)
				}
			case 7:
				now = now.Add(time.Duration(rng.IntN(90)) * time.Second)
			}
			checkIndex(t, a)
		}
	}
}

// TestDeclineFlood: one VM declines every address of a host network with
// its own MAC. Only its own address goes into quarantine; the victim still
// renews its address and a new VM still gets one.
func TestDeclineFlood(t *testing.T) {
	n := testNet("h", api.ModeHost, "10.9.2.0/24")
	n.LeaseTime = time.Hour
	a := mustAllocator(t, n, "")
	now := guardNow
	a.now = func() time.Time { return now }
	victim, attacker := mustMAC("52:55:55:00:03:01"), mustMAC("52:55:55:00:03:02")
	vip := lease(t, a, victim.String())
	aip := lease(t, a, attacker.String())
	ignored := 0
	for ip := n.Subnet.Addr(); n.Subnet.Contains(ip); ip = ip.Next() {
		err := a.Decline(attacker, ip)
		switch {
		case ip == aip && err != nil:
			t.Fatalf("the holder's DECLINE of %s: %v", ip, err)
		case ip != aip && !errors.Is(err, ErrNotHolder):
			t.Fatalf("DECLINE of %s, held by someone else or no one: %v, want ErrNotHolder", ip, err)
		case ip != aip:
			ignored++
		}
	}
	if ignored != 255 || len(a.declined) != 1 {
		t.Fatalf("%d DECLINEs ignored, %d addresses declined (%v); want 255 and 1", ignored, len(a.declined), a.declined)
	}
	now = now.Add(n.LeaseTime / 2)
	if l, err := a.Commit(victim, vip, ""); err != nil || l.IP != vip {
		t.Fatalf("the victim's renewal of %s: %+v, %v", vip, l, err)
	}
	nip := lease(t, a, "52:55:55:00:03:03")
	if nip == vip || nip == aip {
		t.Fatalf("the new VM got %s (victim %s, attacker's declined %s)", nip, vip, aip)
	}
	checkIndex(t, a)
}

// TestDeclineBoundedReturn: a declined address is offered to no one for
// declineHold, or the lease time if shorter, then comes back.
func TestDeclineBoundedReturn(t *testing.T) {
	for _, lt := range []time.Duration{time.Hour, time.Minute} {
		hold := min(declineHold, lt)
		n := testNet("h", api.ModeHost, "10.9.3.0/29")
		n.DHCPEnd = ip("10.9.3.3") // two addresses: .2 and .3
		n.LeaseTime = lt
		a := mustAllocator(t, n, "")
		now := guardNow
		a.now = func() time.Time { return now }
		m1, m3 := mustMAC("52:55:55:00:04:01"), mustMAC("52:55:55:00:04:03")
		first := lease(t, a, m1.String())
		if err := a.Decline(m1, first); err != nil {
			t.Fatal(err)
		}
		if got := lease(t, a, m1.String()); got == first {
			t.Fatalf("lease time %s: after its DECLINE, %s got %s again", lt, m1, first)
		}
		now = now.Add(hold - time.Second)
		if got, err := a.Offer(m3, first); err == nil {
			t.Fatalf("lease time %s: %s offered %s %s after it was declined", lt, m3, got, hold-time.Second)
		}
		now = now.Add(time.Second)
		if got, err := a.Offer(m3, netip.Addr{}); err != nil || got != first {
			t.Fatalf("lease time %s: %s after the DECLINE, the offer is %s, %v; want %s back", lt, hold, got, err, first)
		}
		if len(a.declined) != 0 {
			t.Fatalf("lease time %s: quarantine over, still declined: %v", lt, a.declined)
		}
		checkIndex(t, a)
	}
}

// TestDeclineQuarantinePerMAC: a MAC that leases and declines address
// after address keeps at most maxDeclinesPerMAC of them in quarantine.
func TestDeclineQuarantinePerMAC(t *testing.T) {
	n := testNet("h", api.ModeHost, "10.9.4.0/24")
	a := mustAllocator(t, n, "")
	a.now = func() time.Time { return guardNow }
	m := mustMAC("52:55:55:00:05:01")
	for range 50 {
		if err := a.Decline(m, lease(t, a, m.String())); err != nil {
			t.Fatal(err)
		}
	}
	if len(a.declined) != maxDeclinesPerMAC {
		t.Fatalf("%d addresses in quarantine after 50 DECLINEs by one MAC, want %d", len(a.declined), maxDeclinesPerMAC)
	}
	checkIndex(t, a)
}

// TestCommitDurableAndGrouped: a lease is on disk when Commit returns;
// concurrent commits share writes; a failed write fails the commit and
// leaves no lease behind.
func TestCommitDurableAndGrouped(t *testing.T) {
	n := testNet("p", api.ModeShared, "10.9.5.0/24")
	path := filepath.Join(t.TempDir(), "p.leases.json")
	a := mustAllocator(t, n, path)
	t.Cleanup(a.Close)
	var writes atomic.Int64
	slow := func(f *os.File, data []byte) error {
		writes.Add(1)
		time.Sleep(20 * time.Millisecond) // an fsync on a slow disk
		return appendSync(f, data)
	}
	a.appendSync = slow
	// One commit, then a fresh allocator on the same file: the lease is there.
	m0 := mustMAC("52:55:55:00:06:00")
	l0, err := a.Commit(m0, ip("10.9.5.2"), "vm0")
	if err != nil {
		t.Fatal(err)
	}
	b := mustAllocator(t, n, path)
	if got, ok := b.Lookup(m0); !ok || got.IP != l0.IP || got.Hostname != "vm0" || !got.Expiry.Equal(l0.Expiry) {
		t.Fatalf("after Commit returned, a fresh allocator sees %+v, %v; want %+v", got, ok, l0)
	}
	// N concurrent commits, each on disk when it returns, in far fewer writes.
	const N = 64
	writes.Store(0)
	var wg sync.WaitGroup
	errs := make([]error, N)
	for i := range N {
		wg.Go(func() {
			m := mustMAC(fmt.Sprintf("52:55:55:00:06:%02x", i+1))
			if _, errs[i] = a.Commit(m, addrU32(u32(ip("10.9.5.10"))+uint32(i)), ""); errs[i] != nil {
				return
			}
			if c, err := NewAllocator(n, path); err != nil {
				errs[i] = err
			} else if _, ok := c.Lookup(m); !ok {
				errs[i] = fmt.Errorf("%s: Commit returned, the file has no lease", m)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if w := writes.Load(); w > N/8 {
		t.Fatalf("%d concurrent commits took %d writes, want at most %d", N, w, N/8)
	} else {
		t.Logf("%d concurrent commits, %d writes", N, w)
	}
	c := mustAllocator(t, n, path)
	if got := len(c.Leases()); got != N+1 {
		t.Fatalf("%d leases on disk, want %d", got, N+1)
	}
	// A write that fails: no ACK, and no lease in memory either.
	a.appendSync = func(*os.File, []byte) error { return errors.New("disk full") }
	mf := mustMAC("52:55:55:00:06:ff")
	if _, err := a.Commit(mf, ip("10.9.5.200"), ""); err == nil {
		t.Fatal("Commit succeeded with a failing write")
	}
	if l, ok := a.Lookup(mf); ok {
		t.Fatalf("a lease that was not written stays: %+v", l)
	}
	checkIndex(t, a)
	// The journal goes on after the failed write.
	a.appendSync = appendSync
	if _, err := a.Commit(mf, ip("10.9.5.200"), ""); err != nil {
		t.Fatal(err)
	}
	if _, ok := mustAllocator(t, n, path).Lookup(mf); !ok {
		t.Fatal("the commit after a failed write is not on disk")
	}
}

// TestJournalCommitCost: a commit writes one journal record, the same few
// bytes whether the network has 10 leases or 60k, and never the snapshot.
func TestJournalCommitCost(t *testing.T) {
	perCommit := map[int]int64{}
	for _, n := range []int{10, 60_000} {
		a := bigAllocator(t, n)
		t.Cleanup(a.Close)
		var bytes, appends, snapshots atomic.Int64
		a.appendSync = func(f *os.File, data []byte) error {
			bytes.Add(int64(len(data)))
			appends.Add(1)
			return appendSync(f, data)
		}
		a.write = func(p string, data []byte) error {
			snapshots.Add(1)
			return writeFileAtomic(p, data)
		}
		mac := mustMAC("52:56:00:00:00:01")
		const commits = 100
		for range commits {
			off, err := a.Offer(mac, netip.Addr{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := a.Commit(mac, off, "renewer"); err != nil {
				t.Fatal(err)
			}
		}
		a.bg.Wait()
		if appends.Load() != commits || snapshots.Load() != 0 {
			t.Errorf("%d leases: %d commits made %d journal writes and %d snapshot writes, want %d and 0",
				n, commits, appends.Load(), snapshots.Load(), commits)
		}
		perCommit[n] = bytes.Load() / commits
		if perCommit[n] > 512 {
			t.Errorf("%d leases: %d bytes written per commit, want at most 512", n, perCommit[n])
		}
	}
	// The same record but for the digits of its sequence number.
	if d := perCommit[60_000] - perCommit[10]; d < -8 || d > 8 {
		t.Errorf("bytes per commit grow with the leases: %v", perCommit)
	}
}

// TestJournalCrash: granted leases, releases and declines survive a crash
// (no compaction, no Close) that tore the journal's last record; the torn
// record is ignored and the next commit follows the last good one.
func TestJournalCrash(t *testing.T) {
	n := testNet("j", api.ModeShared, "10.9.6.0/24")
	path := filepath.Join(t.TempDir(), "j.leases.json")
	a := mustAllocator(t, n, path)
	macs := []net.HardwareAddr{mustMAC("52:55:55:00:07:00"), mustMAC("52:55:55:00:07:01"), mustMAC("52:55:55:00:07:02"), mustMAC("52:55:55:00:07:03")}
	var granted []Lease
	for i, m := range macs {
		l, err := a.Commit(m, addrU32(u32(ip("10.9.6.10"))+uint32(i)), fmt.Sprintf("vm%d", i))
		if err != nil {
			t.Fatal(err)
		}
		granted = append(granted, l)
	}
	if err := a.Release(macs[1]); err != nil {
		t.Fatal(err)
	}
	if err := a.Decline(macs[2], granted[2].IP); err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	released := *a.leases[macs[1].String()]
	a.mu.Unlock()
	// The crash: half of a record that was being written.
	j, err := os.OpenFile(JournalPath(path), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	torn := appendRecord(nil, journalRecord{Seq: 99, Op: journalSet, Lease: Lease{MAC: "52:55:55:00:07:09", IP: ip("10.9.6.99"), Expiry: guardNow}})
	j.Write(torn[:len(torn)/2])
	j.Close()

	b := mustAllocator(t, n, path)
	t.Cleanup(b.Close)
	check := func(b *Allocator) {
		t.Helper()
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, i := range []int{0, 3} {
			if got := b.leases[macs[i].String()]; got == nil || !sameLease(*got, granted[i]) {
				t.Errorf("granted %+v, after the crash %+v", granted[i], got)
			}
		}
		if got := b.leases[macs[1].String()]; got == nil || !got.Expiry.Equal(released.Expiry) || got.IP != granted[1].IP {
			t.Errorf("released %+v, after the crash %+v", released, got)
		}
		if got := b.leases[macs[2].String()]; got != nil {
			t.Errorf("declined lease back after the crash: %+v", got)
		}
		if got := b.leases["52:55:55:00:07:09"]; got != nil {
			t.Errorf("the torn record was applied: %+v", got)
		}
	}
	check(b)
	// The next commit after the torn end loads back.
	m := mustMAC("52:55:55:00:07:04")
	l, err := b.Commit(m, ip("10.9.6.20"), "")
	if err != nil {
		t.Fatal(err)
	}
	c := mustAllocator(t, n, path)
	t.Cleanup(c.Close)
	check(c)
	if got, ok := c.Lookup(m); !ok || !sameLease(got, l) {
		t.Errorf("committed %+v after the crash, loaded back %+v", l, got)
	}
	if got, err := Read(path, time.Now()); err != nil || len(got) != 3 {
		t.Errorf("ReadLeases: %v, %v; want the 3 unexpired leases", got, err)
	}
}

// TestJournalCompaction: past its bound the journal is folded into the
// snapshot in the background and starts again; everything loads back,
// and so does a snapshot left with the old journal (a crash between the
// two writes).
func TestJournalCompaction(t *testing.T) {
	n := testNet("k", api.ModeShared, "10.9.7.0/24")
	path := filepath.Join(t.TempDir(), "k.leases.json")
	a := mustAllocator(t, n, path)
	t.Cleanup(a.Close)
	a.journalMin = 16
	var old []byte
	for i := range 201 {
		if i == 200 {
			// Commits that came during a compaction are left for the
			// next one: this one starts it, if needed, with none.
			a.bg.Wait()
		}
		m := mustMAC(fmt.Sprintf("52:55:55:00:08:%02x", i%10))
		if _, err := a.Commit(m, addrU32(u32(ip("10.9.7.10"))+uint32(i%10)), fmt.Sprintf("h%d", i)); err != nil {
			t.Fatal(err)
		}
		if i == 150 {
			old, _ = os.ReadFile(JournalPath(path))
		}
	}
	a.bg.Wait()
	jdata, _ := os.ReadFile(JournalPath(path))
	if recs, _ := parseJournal(jdata); len(recs) > 4*10 {
		t.Errorf("%d records in the journal after compaction, want at most %d", len(recs), 4*10)
	}
	var snap leaseFile
	if data, err := os.ReadFile(path); err != nil || json.Unmarshal(data, &snap) != nil || snap.Seq <= 152 {
		t.Fatalf("no snapshot compacted after the 152nd change: seq %d, %v", snap.Seq, err)
	}
	same := func(b *Allocator) {
		t.Helper()
		a.mu.Lock()
		defer a.mu.Unlock()
		if len(b.leases) != len(a.leases) {
			t.Fatalf("%d leases, loaded back %d", len(a.leases), len(b.leases))
		}
		for m, l := range a.leases {
			if o := b.leases[m]; o == nil || !sameLease(*o, *l) {
				t.Fatalf("lease %+v loaded back as %+v", l, o)
			}
		}
	}
	b := mustAllocator(t, n, path)
	same(b)
	b.Close()
	// A crash after the snapshot's rename, before the journal's: the
	// records of the older journal are in the snapshot already and change
	// nothing.
	if err := os.WriteFile(JournalPath(path), append(old, jdata...), 0o644); err != nil {
		t.Fatal(err)
	}
	c := mustAllocator(t, n, path)
	same(c)
	c.Close()
}

func sameLease(x, y Lease) bool {
	return x.MAC == y.MAC && x.IP == y.IP && x.Hostname == y.Hostname && x.Expiry.Equal(y.Expiry)
}

// BenchmarkCommit measures a renewal's commit (journal write and fsync
// included) on a range with many leases.
func BenchmarkCommit(b *testing.B) {
	for _, n := range []int{1_000, 60_000} {
		b.Run(fmt.Sprintf("leases=%d", n), func(b *testing.B) {
			a := bigAllocator(b, n)
			defer a.Close()
			mac := mustMAC("52:56:00:00:00:01")
			off, err := a.Offer(mac, netip.Addr{})
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if _, err := a.Commit(mac, off, ""); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestByHostname: DHCP host names are found by their first label in any
// case, follow renewals, releases, declines and expiry, and of two
// holders the first to claim the name wins (not the lower address, which
// a VM may ask for).
func TestByHostname(t *testing.T) {
	n := testNet("h", api.ModeShared, "10.9.8.0/24")
	a := mustAllocator(t, n, "")
	now := guardNow
	a.now = func() time.Time { return now }
	m1, m2, m3 := mustMAC("52:55:55:00:09:01"), mustMAC("52:55:55:00:09:02"), mustMAC("52:55:55:00:09:03")
	commit := func(m net.HardwareAddr, addr, host string) {
		t.Helper()
		if _, err := a.Commit(m, ip(addr), host); err != nil {
			t.Fatal(err)
		}
	}
	want := func(name, addr string) {
		t.Helper()
		l, ok := a.ByHostname(name)
		switch {
		case addr == "" && ok:
			t.Errorf("%q answered %s, want nothing", name, l.IP)
		case addr != "" && (!ok || l.IP != ip(addr)):
			t.Errorf("%q answered %v (%v), want %s", name, l.IP, ok, addr)
		}
	}
	commit(m1, "10.9.8.20", "Web.example.com")
	commit(m2, "10.9.8.30", "db")
	want("web", "10.9.8.20")
	want("WEB", "10.9.8.20")
	want("web.example.com", "")
	want("db", "10.9.8.30")
	// A renewal with another name takes the old one away.
	commit(m2, "10.9.8.30", "cache")
	want("db", "")
	want("cache", "10.9.8.30")
	// A renewal without a name keeps it.
	commit(m2, "10.9.8.30", "")
	want("cache", "10.9.8.30")
	// Two holders: the first to claim the name keeps it, across its
	// renewals, whatever address the other asks for; then the other.
	commit(m3, "10.9.8.10", "web")
	want("web", "10.9.8.20")
	commit(m1, "10.9.8.20", "Web")
	want("web", "10.9.8.20")
	if err := a.Decline(m1, ip("10.9.8.20")); err != nil {
		t.Fatal(err)
	}
	want("web", "10.9.8.10")
	if err := a.Release(m3); err != nil {
		t.Fatal(err)
	}
	want("web", "")
	now = now.Add(2 * n.LeaseTime)
	want("cache", "")
}

// TestJournalWriteFails: a journal write that fails half-way (the disk
// full, say) is cut off, and the next commit's record follows the last good
// one, after the journal was replaced by a compaction too (which keeps the
// file it wrote open, not a second open of the path): every lease granted
// before and after the failure is there when the file is loaded again.
func TestJournalWriteFails(t *testing.T) {
	n := testNet("jw", api.ModeShared, "10.9.7.0/24")
	path := filepath.Join(t.TempDir(), "jw.leases.json")
	a := mustAllocator(t, n, path)
	commit := func(i int) {
		t.Helper()
		if _, err := a.Commit(mustMAC(fmt.Sprintf("52:55:55:00:08:%02x", i)), addrU32(u32(ip("10.9.7.10"))+uint32(i)), ""); err != nil {
			t.Fatal(err)
		}
	}
	commit(0)
	a.mu.Lock()
	if err := a.restartJournal(); err != nil { // as a compaction does
		a.mu.Unlock()
		t.Fatal(err)
	}
	good := a.appendSync
	a.appendSync = func(f *os.File, data []byte) error {
		f.Write(data[:len(data)/2])
		return errors.New("no space left on device")
	}
	a.mu.Unlock()
	if _, err := a.Commit(mustMAC("52:55:55:00:08:ff"), ip("10.9.7.200"), ""); err == nil {
		t.Fatal("a commit whose write failed succeeded")
	}
	a.mu.Lock()
	a.appendSync = good
	a.mu.Unlock()
	commit(1)
	commit(2)
	b := mustAllocator(t, n, path)
	for i := range 3 {
		if _, ok := b.Lookup(mustMAC(fmt.Sprintf("52:55:55:00:08:%02x", i))); !ok {
			t.Errorf("lease %d lost after a failed write and a reload", i)
		}
	}
}
