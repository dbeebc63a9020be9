// Package leases is a network's DHCP lease store: the allocator that hands
// out the addresses of its range, and the snapshot and journal that keep
// its leases on disk across restarts and crashes.
package leases

import (
	"bytes"
	"cmp"
	"container/heap"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	"math/bits"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/atomicfile"
)

// Lease is a DHCP lease: the address a VM's MAC holds until Expiry, and
// the host name its client sent.
type Lease struct {
	MAC      string     `json:"mac"`
	IP       netip.Addr `json:"ip"`
	Hostname string     `json:"hostname,omitempty"`
	Expiry   time.Time  `json:"expiry"`
	// Learned: the VM gave itself the address (a static address) and the
	// guard's learner bound it (Learn); DHCP did not hand it out.
	Learned bool `json:"learned,omitempty"`
	// Released: the client gave the address back (DHCPRELEASE): it is
	// not kept past its expiry for an attached VM.
	Released bool `json:"released,omitempty"`
}

// leaseFile is the on-disk form of a network's leases: the snapshot. Seq
// is the last change it holds; the journal's records up to it are already
// in it (an older vmnetctl's file has none: 0).
type leaseFile struct {
	Network string  `json:"network"`
	Subnet  string  `json:"subnet"`
	Seq     uint64  `json:"seq,omitempty"`
	Leases  []Lease `json:"leases"`
}

// Read reads the unexpired leases of a lease file and its journal as
// of now, by address: what the DHCP server handed out, readable without it
// (a lease is written before its ACK). A missing file has none.
func Read(path string, now time.Time) ([]Lease, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var f leaseFile
	if json.Unmarshal(data, &f) != nil {
		// Unreadable (truncated, garbage): what its journal holds, as
		// the allocator keeps when it sets the file aside.
		f = leaseFile{}
	}
	byMAC := map[string]*Lease{}
	at := map[netip.Addr]string{}
	for _, l := range f.Leases {
		if _, dup := byMAC[l.MAC]; !dup {
			byMAC[l.MAC] = &l
			at[l.IP] = l.MAC
		}
	}
	if jdata, err := os.ReadFile(JournalPath(path)); err == nil {
		recs, _ := parseJournal(jdata)
		for _, r := range recs {
			if r.Seq > f.Seq {
				r.apply(byMAC, at, func(netip.Addr) bool { return true })
			}
		}
	}
	var out []Lease
	for _, l := range byMAC {
		if now.Before(l.Expiry) {
			out = append(out, *l)
		}
	}
	slices.SortFunc(out, func(x, y Lease) int { return x.IP.Compare(y.IP) })
	return out, nil
}

// ErrNoAddress is returned when the DHCP range has no address left for a client.
var ErrNoAddress = errors.New("no free address in the DHCP range")

// ErrNotHolder is returned by Decline when the declining MAC does not hold
// the address it declines: the DECLINE is ignored.
var ErrNotHolder = errors.New("the client does not hold the address it declines")

const (
	// declineHold is how long a declined address is offered to no one
	// (dnsmasq's choice too), or the lease time if that is shorter: long
	// enough for the host squatting it to go away or be noticed, short
	// enough that a pool emptied by DECLINEs comes back on its own, and
	// never longer than a lease could have held the address anyway.
	declineHold = 10 * time.Minute
	// maxDeclinesPerMAC bounds the addresses one MAC keeps in quarantine at
	// once: a client that leases and declines address after address frees
	// its oldest quarantined address with each new DECLINE beyond this.
	maxDeclinesPerMAC = 4
	// maxRange bounds the addresses an allocator indexes (a /8's worth);
	// a larger DHCP range is cut to its first maxRange addresses.
	maxRange = 1 << 24
)

// Allocator hands out a network's addresses: fixed addresses first
// (reservations of networks.yaml, then those the controller sets at run time),
// else the address the MAC had before, else a free one of the DHCP range. It
// remembers every MAC it has seen, expired or not, and reuses an expired
// lease's address for another MAC only when no never-used address is left, so
// a VM keeps its address across restarts of itself and of vmnetctl.
//
// There is one lease per MAC and one lease per address. Finding an address
// costs O(log n) in the size of the range: a bit tree of the range's taken
// addresses (leased, expired or not; fixed; declined; network, gateway,
// broadcast) with a rotating cursor gives the next never-used one, and a
// heap of leases by expiry gives the one that expired longest ago.
//
// It is safe for concurrent use. With a path, a change is on disk before
// the client hears of it: appended to the journal beside the snapshot at
// path (journalPath) and synced, a record of a few hundred bytes whatever
// the number of leases; changes made while a write is under way share the
// next one (group commit). When the journal holds more than journalFactor
// records per lease, a background compaction writes the snapshot whole
// (atomically: a temporary file renamed over it) and starts the journal
// again. Loading reads the snapshot, then replays the journal's records
// that are newer than it, up to the first torn or corrupt one.
type Allocator struct {
	mu        sync.Mutex
	id        string
	subnet    netip.Prefix
	gateway   netip.Addr
	start     netip.Addr
	end       netip.Addr
	leaseTime time.Duration
	path      string
	now       func() time.Time

	leases   map[string]*Lease        // by MAC
	fixed    map[string]netip.Addr    // by MAC: reservations and SetFixed
	reserved map[string]bool          // MACs whose fixed address comes from networks.yaml
	declined map[netip.Addr]time.Time // addresses a client found in use, until when
	// present are the MACs of the VMs attached to the network now
	// (SetPresent): a lease of theirs that expired is kept (live).
	present map[string]bool

	// offers holds the address offered to each MAC for offerHold, so that
	// clients that discover at once are offered different addresses
	// rather than one, which all but the first would then be refused
	// (NAK) and have to start over. ISC dhcpd and Kea hold offers too.
	offers  map[string]offer      // by MAC
	offered map[netip.Addr]string // by address: the MAC it is offered to

	// The index, derived from the maps above (reindex) and kept up to date
	// by every change.
	indexed    int                     // len(leases) when last indexed
	byIP       map[netip.Addr]string   // the MAC of the lease, expired or not, on each address
	fixedIP    map[netip.Addr]string   // the MAC an address is fixed for; severalMACs if more than one
	refs       map[string]*leaseRef    // by MAC: the leases of the range, in byExpiry
	byExpiry   expiryHeap              // the range's leases, the earliest expiry first
	quarantine untilHeap               // declined addresses by the end of their quarantine
	declinedBy map[netip.Addr]string   // who declined each quarantined address
	declines   map[string][]netip.Addr // by MAC: its quarantined addresses, oldest first
	// byHost indexes leases by hostKey of their host name: the MACs,
	// expired or not, each with the order in which it claimed the name
	// (hostSeq; kept across its renewals), for first come, first served.
	byHost     map[string]map[string]uint64
	hostSeq    uint64
	taken      *bitTree // by offset in the range: not free for a new client
	cursor     uint32   // offset where the search for a free address starts
	base, size uint32   // the range (within the subnet) as numbers

	// Persistence (group commit): gen counts changes, and each change
	// leaves a journal record with its number in pending; a flush waits
	// until a write that includes its change has succeeded or failed.
	write      func(path string, data []byte) error // the snapshot
	appendSync func(f *os.File, data []byte) error  // a journal write
	gen        uint64                               // under mu
	pending    []byte                               // under mu: records not yet written
	pendingN   int
	pmu        sync.Mutex
	pcond      *sync.Cond
	writing    bool
	durable    uint64 // changes up to this one are on disk
	failGen    uint64 // the last failed write held changes up to this one
	failErr    error
	// The writer's (whoever holds writing): the journal, open for
	// appending, its size and records; whether the snapshot exists;
	// during a compaction, the records written since it began.
	journal    *os.File
	jsize      int64
	jrecs      int
	snapped    bool
	compacting bool
	// setAside says why the lease file was set aside at load (SetAside).
	setAside   string
	tail       []byte
	tailN      int
	bg         sync.WaitGroup // a compaction under way
	journalMin int            // journalMin; tests lower it
}

// Compaction starts when the journal holds more than journalFactor records
// per lease, and at least journalMin.
const (
	journalFactor = 4
	journalMin    = 4096
)

// JournalPath is the journal of the snapshot at path.
func JournalPath(path string) string { return path + ".journal" }

// offer is an address offered to a MAC, held for it until until.
type offer struct {
	ip    netip.Addr
	until time.Time
}

// Offers are held this long (a client requests what it was offered at
// once), and at most maxOffers at a time: past that, an offer is made but
// not held, so that a flood of DISCOVERs (possible only from a port
// without the spoofing guard) cannot hold the range.
const (
	offerHold = 10 * time.Second
	maxOffers = 256
)

// severalMACs stands in fixedIP for an address fixed for more than one MAC.
const severalMACs = "(several)"

// NewAllocator returns the allocator of a shared or host network, loading the
// leases kept at path (none if path is "" or the file does not exist yet).
// Leases outside the network's subnet, left from an older configuration, are
// dropped.
func NewAllocator(n *api.Network, path string) (*Allocator, error) {
	if !n.Subnet.IsValid() || !n.DHCPStart.IsValid() || !n.DHCPEnd.IsValid() {
		return nil, fmt.Errorf("network %q has no subnet or DHCP range", n.ID)
	}
	lt := n.LeaseTime
	if lt <= 0 {
		lt = api.DefaultLeaseTime
	}
	a := &Allocator{
		id: n.ID, subnet: n.Subnet, gateway: n.Gateway, start: n.DHCPStart, end: n.DHCPEnd,
		leaseTime: lt, path: path, now: time.Now, write: writeFileAtomic, appendSync: appendSync, journalMin: journalMin,
		leases: map[string]*Lease{}, fixed: map[string]netip.Addr{}, reserved: map[string]bool{},
		declined: map[netip.Addr]time.Time{}, offers: map[string]offer{}, offered: map[netip.Addr]string{},
		present: map[string]bool{},
	}
	a.pcond = sync.NewCond(&a.pmu)
	for _, r := range n.Reservations {
		mac, err := normMAC(r.MAC)
		if err != nil {
			return nil, fmt.Errorf("network %q: reservation %s: %w", n.ID, r.MAC, err)
		}
		a.fixed[mac] = r.IP
		a.reserved[mac] = true
	}
	if path == "" {
		a.reindex()
		return a, nil
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		// A journal without its snapshot is a removed network's (Remove
		// deletes the snapshot): its records are not this network's.
		if err := os.Remove(JournalPath(path)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("removing the stale lease journal of network %q: %w", n.ID, err)
		}
		a.reindex()
		return a, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading leases of network %q: %w", n.ID, err)
	}
	a.snapped = true
	var f leaseFile
	if err := json.Unmarshal(data, &f); err != nil {
		// A snapshot that cannot be read (truncated, garbage) would keep
		// the network from starting until someone deleted it: it is set
		// aside, and the leases its journal holds are kept (written to a
		// new snapshot below, so that the journal is not taken for a
		// removed network's at the next start).
		aside := path + ".unreadable"
		if rerr := os.Rename(path, aside); rerr != nil {
			return nil, fmt.Errorf("reading leases of network %q from %s: %w (setting it aside: %v)", n.ID, path, err, rerr)
		}
		a.setAside = fmt.Sprintf("%s could not be read (%v): set aside as %s; the leases its journal holds are kept", path, err, aside)
		a.snapped, f = false, leaseFile{}
	}
	// One lease per MAC and one per address: a file that says otherwise
	// (edited, or from a bug) keeps the first of each MAC and, of each
	// address, the first unexpired lease, else the first.
	now := a.now()
	at := map[netip.Addr]string{}
	for _, l := range f.Leases {
		mac, err := normMAC(l.MAC)
		if err != nil || !a.usable(l.IP) {
			continue
		}
		if _, dup := a.leases[mac]; dup {
			continue
		}
		if m, ok := at[l.IP]; ok {
			if a.leases[m].Expiry.After(now) || !l.Expiry.After(now) {
				continue
			}
			delete(a.leases, m)
		}
		l.MAC = mac
		a.leases[mac] = &l
		at[l.IP] = mac
	}
	a.gen = f.Seq
	if err := a.replayJournal(f.Seq, at); err != nil {
		return nil, fmt.Errorf("reading leases of network %q: %w", n.ID, err)
	}
	a.durable = a.gen
	a.reindex()
	if !a.snapped {
		if err := a.writeSnapshot(a.snapshot()); err != nil {
			return nil, fmt.Errorf("saving leases of network %q: %w", n.ID, err)
		}
		a.snapped = true
	}
	return a, nil
}

// SetAside says, if the lease file could not be read when the allocator
// loaded it, where it was set aside and why; "" if it was read.
func (a *Allocator) SetAside() string { return a.setAside }

// replayJournal applies the journal's records newer than the snapshot
// (seq), up to the first torn or corrupt one, and cuts the journal there,
// so that new records follow the last good one.
func (a *Allocator) replayJournal(seq uint64, at map[netip.Addr]string) error {
	jp := JournalPath(a.path)
	data, err := os.ReadFile(jp)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	recs, good := parseJournal(data)
	for _, r := range recs {
		if r.Seq > seq {
			r.apply(a.leases, at, a.usable)
		}
		a.gen = max(a.gen, r.Seq)
	}
	if good < len(data) {
		if err := os.Truncate(jp, int64(good)); err != nil {
			return fmt.Errorf("cutting the torn end of %s: %w", jp, err)
		}
	}
	a.jsize, a.jrecs = int64(good), len(recs)
	return nil
}

func normMAC(s string) (string, error) {
	hw, err := net.ParseMAC(s)
	if err != nil {
		return "", err
	}
	if len(hw) != 6 {
		return "", fmt.Errorf("%s is not a 48-bit MAC address", s)
	}
	return hw.String(), nil
}

// usable reports whether ip may be given to a client at all.
func (a *Allocator) usable(ip netip.Addr) bool {
	return ip.IsValid() && ip.Is4() && a.subnet.Contains(ip) && ip != a.gateway &&
		ip != a.subnet.Addr() && ip != lastAddr(a.subnet)
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().As4()
	host := 32 - p.Bits()
	for i := 3; i >= 0 && host > 0; i-- {
		n := min(host, 8)
		b[i] |= byte(1<<n - 1)
		host -= n
	}
	return netip.AddrFrom4(b)
}

func u32(ip netip.Addr) uint32 {
	b := ip.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

func addrU32(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// offset returns ip's place in the indexed range.
func (a *Allocator) offset(ip netip.Addr) (uint32, bool) {
	if a.size == 0 || !ip.Is4() {
		return 0, false
	}
	v := u32(ip)
	if v < a.base || v-a.base >= a.size {
		return 0, false
	}
	return v - a.base, true
}

func (a *Allocator) inRange(ip netip.Addr) bool {
	_, ok := a.offset(ip)
	return ok && a.usable(ip)
}

// reindex rebuilds the index from leases, fixed and declined. Tests may
// add leases to the map directly; sync notices and reindexes.
func (a *Allocator) reindex() {
	a.base, a.size = 0, 0
	if a.start.Is4() && a.end.Is4() && a.subnet.Addr().Is4() {
		lo := max(u32(a.start), u32(a.subnet.Masked().Addr()))
		hi := min(u32(a.end), u32(lastAddr(a.subnet)))
		if lo <= hi {
			a.base, a.size = lo, uint32(min(uint64(hi)-uint64(lo)+1, maxRange))
		}
	}
	a.taken = newBitTree(a.size)
	if a.cursor >= a.size {
		a.cursor = 0
	}
	a.byIP = map[netip.Addr]string{}
	a.byHost = map[string]map[string]uint64{}
	a.refs = map[string]*leaseRef{}
	a.byExpiry = nil
	// One lease per address: of several, the one that expires last.
	for _, m := range slices.Sorted(maps.Keys(a.leases)) {
		l := a.leases[m]
		if o, dup := a.byIP[l.IP]; dup {
			if !l.Expiry.After(a.leases[o].Expiry) {
				delete(a.leases, m)
				continue
			}
			a.unlinkLease(o)
			delete(a.leases, o)
		}
		a.linkLease(l)
	}
	a.fixedIP = map[netip.Addr]string{}
	for m, ip := range a.fixed {
		if o, dup := a.fixedIP[ip]; dup && o != m {
			a.fixedIP[ip] = severalMACs
		} else {
			a.fixedIP[ip] = m
		}
	}
	a.quarantine = nil
	a.declinedBy = map[netip.Addr]string{}
	a.declines = map[string][]netip.Addr{}
	for ip, until := range a.declined {
		heap.Push(&a.quarantine, quarantined{ip, until})
	}
	for _, ip := range []netip.Addr{a.subnet.Masked().Addr(), a.gateway, lastAddr(a.subnet)} {
		a.refresh(ip)
	}
	for ip := range a.fixedIP {
		a.refresh(ip)
	}
	for ip := range a.declined {
		a.refresh(ip)
	}
	a.indexed = len(a.leases)
}

// sync reindexes when the lease map was changed behind the index's back.
func (a *Allocator) sync(now time.Time) {
	if len(a.leases) != a.indexed {
		a.reindex()
	}
	// Quarantines that are over.
	for len(a.quarantine) > 0 && !now.Before(a.quarantine[0].until) {
		q := heap.Pop(&a.quarantine).(quarantined)
		if until, ok := a.declined[q.ip]; ok && !now.Before(until) {
			a.unquarantine(q.ip)
		}
	}
}

func (a *Allocator) unquarantine(ip netip.Addr) {
	delete(a.declined, ip)
	if m, ok := a.declinedBy[ip]; ok {
		delete(a.declinedBy, ip)
		a.declines[m] = slices.DeleteFunc(a.declines[m], func(x netip.Addr) bool { return x == ip })
		if len(a.declines[m]) == 0 {
			delete(a.declines, m)
		}
	}
	a.refresh(ip)
}

// refresh sets ip's bit in the tree: taken unless usable, in the range,
// fixed for no one, leased to no one (expired or not) and not declined.
// Quarantines that are over but not yet popped count as taken; sync pops
// them before any decision.
func (a *Allocator) refresh(ip netip.Addr) {
	off, ok := a.offset(ip)
	if !ok {
		return
	}
	_, leased := a.byIP[ip]
	_, fixed := a.fixedIP[ip]
	_, declined := a.declined[ip]
	if !a.usable(ip) || leased || fixed || declined {
		a.taken.set(off)
	} else {
		a.taken.clear(off)
	}
}

// linkLease indexes l, which must be a.leases[l.MAC], on an address no
// other lease has.
func (a *Allocator) linkLease(l *Lease) {
	a.byIP[l.IP] = l.MAC
	if k := hostKey(l.Hostname); k != "" {
		if a.byHost[k] == nil {
			a.byHost[k] = map[string]uint64{}
		}
		if _, ok := a.byHost[k][l.MAC]; !ok {
			a.hostSeq++
			a.byHost[k][l.MAC] = a.hostSeq
		}
	}
	if a.inRange(l.IP) {
		r := &leaseRef{mac: l.MAC, ip: l.IP, exp: l.Expiry}
		a.refs[l.MAC] = r
		heap.Push(&a.byExpiry, r)
	}
	a.refresh(l.IP)
}

// unlinkLease removes mac's lease from the index (not from a.leases).
func (a *Allocator) unlinkLease(mac string) {
	l, ok := a.leases[mac]
	if !ok {
		return
	}
	if a.byIP[l.IP] == mac {
		delete(a.byIP, l.IP)
	}
	if k := hostKey(l.Hostname); k != "" {
		delete(a.byHost[k], mac)
		if len(a.byHost[k]) == 0 {
			delete(a.byHost, k)
		}
	}
	if r, ok := a.refs[mac]; ok {
		heap.Remove(&a.byExpiry, r.idx)
		delete(a.refs, mac)
	}
	a.refresh(l.IP)
}

// setLease makes l mac's lease, taking its address over from any other
// MAC (whose lease is forgotten).
func (a *Allocator) setLease(l *Lease) {
	if h, ok := a.byIP[l.IP]; ok && h != l.MAC {
		a.dropLease(h)
	}
	// A renewal under the same host name keeps the MAC's claim on it.
	k := hostKey(l.Hostname)
	seq, renewing := uint64(0), false
	if old, ok := a.leases[l.MAC]; ok && k != "" && hostKey(old.Hostname) == k {
		seq, renewing = a.byHost[k][l.MAC], true
	}
	a.unlinkLease(l.MAC)
	a.leases[l.MAC] = l
	a.linkLease(l)
	if renewing {
		a.byHost[k][l.MAC] = seq
	}
	a.indexed = len(a.leases)
}

func (a *Allocator) dropLease(mac string) {
	a.unlinkLease(mac)
	delete(a.leases, mac)
	a.indexed = len(a.leases)
}

// free reports whether ip may go to mac now: fixed for no other MAC, not
// leased (live) to another MAC, and, unless mac has a fixed address, not
// declined. With reclaim, a lease kept past its expiry for a VM that is
// attached (live) does not count: its address goes to mac when no other
// is left.
func (a *Allocator) free(ip netip.Addr, mac string, now time.Time, reclaim ...bool) bool {
	if o, ok := a.fixedIP[ip]; ok && o != mac {
		return false
	}
	reclaiming := len(reclaim) > 0
	if m, ok := a.byIP[ip]; ok && m != mac && now.Before(a.leases[m].Expiry) && !(reclaiming && a.leases[m].Learned) {
		return false
	}
	if m, ok := a.byIP[ip]; ok && m != mac && a.present[m] && !a.leases[m].Released && !reclaiming {
		return false // kept for an attached VM whose lease expired
	}
	if m, ok := a.offered[ip]; ok && m != mac && now.Before(a.offers[m].until) {
		return false
	}
	if until, ok := a.declined[ip]; ok && now.Before(until) {
		if _, fixed := a.fixed[mac]; !fixed {
			return false
		}
	}
	return true
}

// pick chooses the address for mac, preferring requested when it is free.
func (a *Allocator) pick(mac string, requested netip.Addr, now time.Time) (netip.Addr, error) {
	if ip, ok := a.fixed[mac]; ok {
		if o := a.fixedIP[ip]; o != mac {
			return netip.Addr{}, fmt.Errorf("%s is fixed for %s and another MAC", ip, mac)
		}
		return ip, nil
	}
	if l, ok := a.leases[mac]; ok && a.inRange(l.IP) && a.free(l.IP, mac, now) {
		return l.IP, nil
	}
	if a.inRange(requested) && a.free(requested, mac, now) {
		if h, ok := a.byIP[requested]; !ok || h == mac {
			return requested, nil
		}
	}
	// A never-used address first, from the cursor on and around, passing
	// over those offered to other MACs (at most maxOffers).
	for _, from := range []uint32{a.cursor, 0} {
		for off, ok := a.taken.next(from); ok; off, ok = a.taken.next(off + 1) {
			if ip := addrU32(a.base + off); a.free(ip, mac, now) {
				return ip, nil
			}
		}
	}
	// Then the one that expired longest ago. Leases whose address is not
	// free (fixed for someone, declined) are set aside and put back.
	var aside []*leaseRef
	defer func() {
		for _, r := range aside {
			heap.Push(&a.byExpiry, r)
		}
	}()
	for len(a.byExpiry) > 0 {
		r := a.byExpiry[0]
		if now.Before(r.exp) {
			break
		}
		if a.free(r.ip, mac, now) {
			return r.ip, nil
		}
		aside = append(aside, heap.Pop(&a.byExpiry).(*leaseRef))
	}
	// Last, with nothing else left, an expired lease kept for a VM that is
	// attached (the one that expired longest ago): DHCP's clients come
	// first, as libvirt and vmnet serve them.
	for _, r := range aside {
		if a.free(r.ip, mac, now, true) {
			return r.ip, nil
		}
	}
	// And an address a VM gave itself (learned), the one learned longest
	// ago (Offer and Commit must agree): DHCP's clients come first.
	var learned []*Lease
	for _, l := range a.leases {
		if l.Learned && a.inRange(l.IP) && a.free(l.IP, mac, now, true) {
			learned = append(learned, l)
		}
	}
	if len(learned) > 0 {
		l := slices.MinFunc(learned, func(x, y *Lease) int {
			if c := x.Expiry.Compare(y.Expiry); c != 0 {
				return c
			}
			return x.IP.Compare(y.IP)
		})
		return l.IP, nil
	}
	return netip.Addr{}, ErrNoAddress
}

// MaxLearned is the most addresses a network's VMs may give themselves
// (learned, live) at once: a guest that claims address after address, on
// ports it makes anew, costs the host a lease and a guard element each.
const MaxLearned = 1024

// Learn gives mac the address ip, which its VM gave itself and announced
// by ARP (the guard's learner), as a lease marked learned, for the lease
// time, if ip is free: in the subnet and not its gateway, network or
// broadcast address; fixed for no one; leased (live) to, offered to or
// declined by no other MAC. A MAC with an address of its own (a fixed
// one, or a live DHCP lease) learns none, and a MAC holds one learned
// address: a newer one replaces it. DHCP's clients come first: a learned
// address in the DHCP range goes to one of them when no other is left.
func (a *Allocator) Learn(mac net.HardwareAddr, ip netip.Addr) (Lease, error) {
	a.mu.Lock()
	now := a.now()
	a.sync(now)
	m := mac.String()
	fail := func(format string, args ...any) (Lease, error) {
		a.mu.Unlock()
		return Lease{}, fmt.Errorf("%s may not use %s: "+format, append([]any{m, ip}, args...)...)
	}
	if !a.usable(ip) {
		return fail("not an address of %s for a VM", a.subnet)
	}
	if fixed, ok := a.fixed[m]; ok {
		return fail("its address is %s", fixed)
	}
	if l, ok := a.leases[m]; ok && !l.Learned && a.live(l, now) {
		return fail("DHCP gave it %s", l.IP)
	}
	if !a.free(ip, m, now) {
		return fail("the address is taken")
	}
	learned := 0
	for _, l := range a.leases {
		if l.Learned && l.MAC != m && a.live(l, now) {
			learned++
		}
	}
	if learned >= MaxLearned {
		return fail("the network's VMs hold %d addresses they gave themselves, the most", learned)
	}
	l := &Lease{MAC: m, IP: ip, Expiry: now.Add(a.leaseTime).Truncate(time.Second), Learned: true}
	return a.setDurably(l, a.leases[m], nil)
}

// setDurably makes l its MAC's lease (in place of prev; over, if set, the
// lease of another MAC whose address it takes over) and returns once it
// is on disk. Called with a.mu held, which it releases. If the write
// fails, the change is undone, unless it was changed since.
func (a *Allocator) setDurably(l, prev, over *Lease) (Lease, error) {
	m := l.MAC
	a.setLease(l)
	a.dropOffer(m)
	g := a.record(journalSet, *l)
	a.mu.Unlock()
	if err := a.flush(g); err != nil {
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.leases[m] == l { // undo, unless changed since
			a.dropLease(m)
			if prev != nil {
				a.setLease(prev)
			}
			if _, taken := a.byIP[l.IP]; over != nil && !taken && a.leases[over.MAC] == nil {
				a.setLease(over)
			}
		}
		return Lease{}, err
	}
	return *l, nil
}

// Offer returns the address to offer mac (DHCPDISCOVER); requested is the
// client's wish, honoured when free. The address is held for mac for
// offerHold (no other client is offered it meanwhile); nothing is leased.
func (a *Allocator) Offer(mac net.HardwareAddr, requested netip.Addr) (netip.Addr, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	a.sync(now)
	m := mac.String()
	ip, err := a.pick(m, requested, now)
	if err != nil {
		return ip, err
	}
	a.holdOffer(m, ip, now)
	return ip, nil
}

// holdOffer holds ip for mac until now+offerHold, in place of the MAC's
// earlier offer, unless maxOffers are held (those that ran out are
// dropped first).
func (a *Allocator) holdOffer(mac string, ip netip.Addr, now time.Time) {
	a.dropOffer(mac)
	if len(a.offers) >= maxOffers {
		for m, o := range a.offers {
			if !now.Before(o.until) {
				a.dropOffer(m)
			}
		}
		if len(a.offers) >= maxOffers {
			return
		}
	}
	a.offers[mac] = offer{ip: ip, until: now.Add(offerHold)}
	a.offered[ip] = mac
}

// dropOffer forgets the offer held for mac, if any.
func (a *Allocator) dropOffer(mac string) {
	if o, ok := a.offers[mac]; ok {
		delete(a.offers, mac)
		if a.offered[o.ip] == mac {
			delete(a.offered, o.ip)
		}
	}
}

// LeaseTime is how long a lease lasts.
func (a *Allocator) LeaseTime() time.Duration { return a.leaseTime }

// Now is the allocator's clock: time.Now, or the one SetClock gave.
func (a *Allocator) Now() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.now()
}

// SetClock makes now the allocator's clock, for tests whose leases expire
// at a time they choose.
func (a *Allocator) SetClock(now func() time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.now = now
}

// Declined tells whether ip is set aside after a DECLINE (Decline), to be
// offered to no one but a MAC it is fixed for until the quarantine ends.
func (a *Allocator) Declined(ip netip.Addr) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	until, ok := a.declined[ip]
	return ok && a.now().Before(until)
}

// Commit leases ip to mac (DHCPREQUEST) for the lease time and persists it:
// when it returns without error, the lease is on disk. It fails when ip is
// not the address mac should have, so the server can NAK.
func (a *Allocator) Commit(mac net.HardwareAddr, ip netip.Addr, hostname string) (Lease, error) {
	a.mu.Lock()
	now := a.now()
	a.sync(now)
	m := mac.String()
	want, err := a.pick(m, ip, now)
	if err != nil {
		a.mu.Unlock()
		return Lease{}, err
	}
	if want != ip {
		a.mu.Unlock()
		return Lease{}, fmt.Errorf("%s is not available to %s (it would get %s)", ip, m, want)
	}
	l := &Lease{MAC: m, IP: ip, Hostname: hostname, Expiry: now.Add(a.leaseTime).Truncate(time.Second)}
	prev := a.leases[m]
	if hostname == "" && prev != nil {
		l.Hostname = prev.Hostname
	}
	// A lease that expired and was remembered for another MAC is taken over.
	var over *Lease
	if h, ok := a.byIP[ip]; ok && h != m {
		over = a.leases[h]
	}
	if off, ok := a.offset(ip); ok && !a.taken.has(off) {
		a.cursor = off + 1
		if a.cursor >= a.size {
			a.cursor = 0
		}
	}
	return a.setDurably(l, prev, over)
}

// Decline records that mac found its address in use by someone else
// (DHCPDECLINE). Only the holder of an unexpired lease on ip may decline
// it, else nothing changes and the error is ErrNotHolder. The holder's
// lease is dropped and the address offered to no one (but a MAC it is
// fixed for) for declineHold or the lease time, whichever is shorter; a
// MAC keeps at most maxDeclinesPerMAC addresses in quarantine.
func (a *Allocator) Decline(mac net.HardwareAddr, ip netip.Addr) error {
	a.mu.Lock()
	now := a.now()
	a.sync(now)
	m := mac.String()
	l, ok := a.leases[m]
	if !ip.IsValid() && ok {
		ip = l.IP
	}
	if !ok || l.IP != ip || !a.live(l, now) {
		a.mu.Unlock()
		return fmt.Errorf("%s declined %s: %w", m, ip, ErrNotHolder)
	}
	a.dropLease(m)
	if _, again := a.declined[ip]; again {
		a.unquarantine(ip)
	}
	mine := a.declines[m]
	for len(mine) >= maxDeclinesPerMAC {
		a.unquarantine(mine[0])
		mine = a.declines[m]
	}
	until := now.Add(min(declineHold, a.leaseTime))
	a.declined[ip] = until
	a.declinedBy[ip] = m
	a.declines[m] = append(a.declines[m], ip)
	heap.Push(&a.quarantine, quarantined{ip, until})
	a.refresh(ip)
	g := a.record(journalDrop, Lease{MAC: m, IP: ip})
	a.mu.Unlock()
	return a.flush(g)
}

// Release ends mac's lease now (DHCPRELEASE) but remembers the
// address, so mac gets it back when it asks again and it is still free.
func (a *Allocator) Release(mac net.HardwareAddr) error {
	a.mu.Lock()
	now := a.now()
	a.sync(now)
	l, ok := a.leases[mac.String()]
	if !ok || !a.live(l, now) {
		a.mu.Unlock()
		return nil
	}
	l.Expiry, l.Released = now.Truncate(time.Second), true
	if r, ok := a.refs[l.MAC]; ok {
		r.exp = l.Expiry
		heap.Fix(&a.byExpiry, r.idx)
	}
	g := a.record(journalSet, *l)
	a.mu.Unlock()
	return a.flush(g)
}

// SetFixed pins mac to ip from now on (a VM file's `ip:`). The address must
// be in the subnet, and neither the gateway nor fixed for another MAC; it may
// lie outside the DHCP range. A client holding a dynamic lease on it is
// refused (NAK) when it renews and gets another address.
func (a *Allocator) SetFixed(mac net.HardwareAddr, ip netip.Addr) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.sync(a.now())
	m := mac.String()
	if !a.usable(ip) {
		return fmt.Errorf("network %q: %s is not a host address of %s other than the gateway %s", a.id, ip, a.subnet, a.gateway)
	}
	if o, ok := a.fixedIP[ip]; ok && o != m {
		return fmt.Errorf("network %q: %s is already fixed for %s", a.id, ip, o)
	}
	if a.reserved[m] && a.fixed[m] != ip {
		return fmt.Errorf("network %q: %s has the reservation %s in networks.yaml", a.id, m, a.fixed[m])
	}
	old, had := a.fixed[m]
	a.fixed[m] = ip
	if had && old != ip {
		a.refixed(old)
	}
	a.refixed(ip)
	return nil
}

// refixed recomputes fixedIP[ip] from a.fixed (a handful of entries).
func (a *Allocator) refixed(ip netip.Addr) {
	delete(a.fixedIP, ip)
	for m, f := range a.fixed {
		if f != ip {
			continue
		}
		if _, dup := a.fixedIP[ip]; dup {
			a.fixedIP[ip] = severalMACs
		} else {
			a.fixedIP[ip] = m
		}
	}
	a.refresh(ip)
}

// ClearFixed undoes SetFixed; reservations of networks.yaml stay.
func (a *Allocator) ClearFixed(mac net.HardwareAddr) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.sync(a.now())
	m := mac.String()
	if ip, ok := a.fixed[m]; ok && !a.reserved[m] {
		delete(a.fixed, m)
		a.refixed(ip)
	}
}

// Lookup returns the current (live) lease of mac.
func (a *Allocator) Lookup(mac net.HardwareAddr) (Lease, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	l, ok := a.leases[mac.String()]
	if !ok || !a.live(l, a.now()) {
		return Lease{}, false
	}
	return *l, true
}

// MACOf returns the MAC whose lease (expired or not) has ip, if any.
func (a *Allocator) MACOf(ip netip.Addr) (string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	mac, ok := a.byIP[ip]
	return mac, ok
}

// Fixed returns the fixed address of mac, if any.
func (a *Allocator) Fixed(mac net.HardwareAddr) (netip.Addr, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ip, ok := a.fixed[mac.String()]
	return ip, ok
}

// BoundTo returns the addresses bound to mac now: its fixed address (a
// reservation or SetFixed) and the address of its unexpired lease. These
// are the sources the guard lets it send from.
func (a *Allocator) BoundTo(mac net.HardwareAddr) []netip.Addr {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.boundTo(mac.String(), a.now())
}

func (a *Allocator) boundTo(m string, now time.Time) []netip.Addr {
	var ips []netip.Addr
	if ip, ok := a.fixed[m]; ok {
		ips = append(ips, ip)
	}
	if l, ok := a.leases[m]; ok && a.live(l, now) && !slices.Contains(ips, l.IP) {
		// Not an address fixed for another MAC since (a VM file's ip:,
		// told after the lease was made): the address is never two
		// MACs' in the guard.
		if o, fixed := a.fixedIP[l.IP]; !fixed || o == m {
			ips = append(ips, l.IP)
		}
	}
	return ips
}

// live tells whether lease l holds its address now: unexpired, or kept
// for its VM, which is attached (SetPresent), as long as no other client
// took the address over.
func (a *Allocator) live(l *Lease, now time.Time) bool {
	return now.Before(l.Expiry) || a.present[l.MAC] && !l.Released && a.byIP[l.IP] == l.MAC
}

// SetPresent says whether the VM of mac is attached to the network (the
// controller's attachments): while it is, its lease is kept past its
// expiry, and the guard lets it go on sending from the address (a guest
// whose DHCP client does not renew, busybox `udhcpc -q`, is not cut off),
// unless another client needs the address and no other is left.
func (a *Allocator) SetPresent(mac net.HardwareAddr, present bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if present {
		a.present[mac.String()] = true
	} else {
		delete(a.present, mac.String())
	}
}

// Bound returns BoundTo of every MAC that has an address bound, by MAC.
func (a *Allocator) Bound() map[string][]netip.Addr {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	out := map[string][]netip.Addr{}
	for m := range a.fixed {
		out[m] = a.boundTo(m, now)
	}
	for m, l := range a.leases {
		if a.live(l, now) {
			out[m] = a.boundTo(m, now)
		}
	}
	return out
}

// hostKey is what a DHCP host name is looked up by: its first label (a
// client may send a full name), in lower case.
func hostKey(hostname string) string {
	host, _, _ := strings.Cut(hostname, ".")
	return strings.ToLower(host)
}

// ByHostname returns the unexpired lease whose DHCP host name (its first
// label, in any case) is name; of several, the one whose MAC claimed the
// name first (first come, first served: a VM cannot take a name another
// holds by asking for a lower address).
// It costs O(1) in the number of leases: an index by name, kept by every
// change of a lease (expiry is checked here).
func (a *Allocator) ByHostname(name string) (Lease, bool) {
	k := hostKey(name)
	if k == "" || k != strings.ToLower(name) {
		return Lease{}, false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	a.sync(now)
	var best *Lease
	var bestSeq uint64
	for m, seq := range a.byHost[k] {
		if l := a.leases[m]; l != nil && a.live(l, now) && (best == nil || seq < bestSeq) {
			best, bestSeq = l, seq
		}
	}
	if best == nil {
		return Lease{}, false
	}
	return *best, true
}

// Leases returns the live leases (unexpired, or kept for an attached VM),
// by address.
func (a *Allocator) Leases() []Lease {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	var out []Lease
	for _, l := range a.leases {
		if a.live(l, now) {
			out = append(out, *l)
		}
	}
	slices.SortFunc(out, func(x, y Lease) int { return x.IP.Compare(y.IP) })
	return out
}

// flush returns once the changes up to g are on disk, or a write that held
// them failed. One caller at a time writes, everything changed so far; the
// callers that arrive meanwhile wait and share the next write.
func (a *Allocator) flush(g uint64) error {
	if a.path == "" {
		return nil
	}
	a.pmu.Lock()
	defer a.pmu.Unlock()
	for {
		switch {
		case a.durable >= g:
			return nil
		case a.failGen >= g:
			return a.failErr
		case a.writing:
			a.pcond.Wait()
			continue
		}
		a.writing = true
		a.pmu.Unlock()
		wg, err := a.persist()
		a.pmu.Lock()
		a.writing = false
		if err == nil {
			a.durable = max(a.durable, wg)
		} else {
			a.failGen, a.failErr = max(a.failGen, wg), err
		}
		a.pcond.Broadcast()
	}
}

// persist writes the changes made so far, and returns the last one the
// write holds: the pending journal records, appended and synced; or, when
// there is no snapshot yet, the snapshot. A journal that has grown past
// its bound is compacted in the background.
func (a *Allocator) persist() (uint64, error) {
	a.mu.Lock()
	g := a.gen
	recs, n := a.pending, a.pendingN
	a.pending, a.pendingN = nil, 0
	var snap leaseFile
	if !a.snapped {
		snap = a.snapshot()
	}
	live := len(a.leases)
	a.mu.Unlock()
	if !a.snapped {
		if err := a.writeSnapshot(snap); err != nil {
			return g, err
		}
		a.snapped = true
		return g, nil
	}
	if err := a.appendJournal(recs); err != nil {
		return g, fmt.Errorf("saving leases of network %q: %w", a.id, err)
	}
	a.jrecs += n
	switch {
	case a.compacting:
		a.tail = append(a.tail, recs...)
		a.tailN += n
	case a.jrecs > max(a.journalMin, journalFactor*live):
		a.compacting = true
		a.bg.Add(1)
		go a.compact()
	}
	return g, nil
}

// appendJournal appends recs to the journal and syncs it; a write that
// fails is cut off again, so that the next record follows the last good
// one.
func (a *Allocator) appendJournal(recs []byte) error {
	if len(recs) == 0 {
		return nil
	}
	if a.journal == nil {
		f, err := os.OpenFile(JournalPath(a.path), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			return err
		}
		if st, err := f.Stat(); err == nil {
			a.jsize = st.Size()
		}
		a.journal = f
	}
	if err := a.appendSync(a.journal, recs); err != nil {
		// Cut off what was written, and write the next record there:
		// after the last good one, not after a hole.
		a.journal.Truncate(a.jsize)
		a.journal.Seek(a.jsize, io.SeekStart)
		return err
	}
	a.jsize += int64(len(recs))
	return nil
}

func appendSync(f *os.File, data []byte) error {
	if _, err := f.Write(data); err != nil {
		return err
	}
	return f.Sync()
}

// compact writes the snapshot whole, then, as the writer, replaces the
// journal with the records written since the snapshot was taken (those
// up to the snapshot's seq among them are skipped when loading). A crash
// between the two leaves the old journal, whose older records are skipped
// too.
func (a *Allocator) compact() {
	defer a.bg.Done()
	a.mu.Lock()
	snap := a.snapshot()
	a.mu.Unlock()
	err := a.writeSnapshot(snap)
	a.pmu.Lock()
	for a.writing {
		a.pcond.Wait()
	}
	a.writing = true
	a.pmu.Unlock()
	if err == nil {
		err = a.restartJournal()
	}
	a.compacting, a.tail, a.tailN = false, nil, 0
	a.pmu.Lock()
	a.writing = false
	a.pcond.Broadcast()
	a.pmu.Unlock()
	_ = err // the journal stays as it was, and grows until the next try
}

// restartJournal replaces the journal with the records written during a
// compaction.
func (a *Allocator) restartJournal() error {
	// The new journal is written, synced and renamed into place through
	// the file it stays open as: no second open that could fail after the
	// rename and leave later records going to the old, unlinked file.
	f, err := atomicfile.Create(JournalPath(a.path), a.tail, leaseFileOptions)
	if err != nil {
		return err
	}
	if a.journal != nil {
		a.journal.Close()
	}
	a.journal, a.jsize, a.jrecs = f, int64(len(a.tail)), a.tailN
	return nil
}

// snapshot returns every lease, expired ones too, as of the last change
// (under mu).
func (a *Allocator) snapshot() leaseFile {
	f := leaseFile{Network: a.id, Subnet: a.subnet.String(), Seq: a.gen, Leases: make([]Lease, 0, len(a.leases))}
	for _, l := range a.leases {
		f.Leases = append(f.Leases, *l)
	}
	return f
}

// writeSnapshot writes f to a.path atomically.
func (a *Allocator) writeSnapshot(f leaseFile) error {
	slices.SortFunc(f.Leases, func(x, y Lease) int { return cmp.Or(x.IP.Compare(y.IP), cmp.Compare(x.MAC, y.MAC)) })
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	if err := a.write(a.path, append(data, '\n')); err != nil {
		return fmt.Errorf("saving leases of network %q: %w", a.id, err)
	}
	return nil
}

// Close waits for a compaction under way and closes the journal.
func (a *Allocator) Close() {
	a.bg.Wait()
	a.pmu.Lock()
	defer a.pmu.Unlock()
	for a.writing {
		a.pcond.Wait()
	}
	if a.journal != nil {
		a.journal.Close()
		a.journal = nil
	}
}

// Journal records, one per line: the CRC-32 of the JSON in hex, a space,
// the JSON of the record. A line that is cut short (a crash in the middle
// of a write) or whose CRC does not match ends the journal.
const (
	journalSet  = "set"  // Lease is the MAC's lease from now on
	journalDrop = "drop" // the MAC's lease is gone (declined)
)

type journalRecord struct {
	Seq   uint64 `json:"seq"`
	Op    string `json:"op"`
	Lease Lease  `json:"lease"`
}

// record numbers a change and adds its journal record to pending (under
// mu); it returns the change's number.
func (a *Allocator) record(op string, l Lease) uint64 {
	a.gen++
	if a.path == "" {
		return a.gen
	}
	a.pending = appendRecord(a.pending, journalRecord{Seq: a.gen, Op: op, Lease: l})
	a.pendingN++
	return a.gen
}

func appendRecord(b []byte, r journalRecord) []byte {
	data, _ := json.Marshal(r) // plain fields: cannot fail
	b = fmt.Appendf(b, "%08x ", crc32.ChecksumIEEE(data))
	b = append(b, data...)
	return append(b, '\n')
}

// parseJournal returns the records of a journal up to the first bad one,
// and the length of the good part.
func parseJournal(data []byte) ([]journalRecord, int) {
	var recs []journalRecord
	good := 0
	for good < len(data) {
		end := bytes.IndexByte(data[good:], '\n')
		if end < 0 {
			break // torn: no end of line
		}
		line := data[good : good+end]
		var sum uint32
		if len(line) < 10 || line[8] != ' ' {
			break
		}
		if _, err := fmt.Sscanf(string(line[:8]), "%08x", &sum); err != nil || crc32.ChecksumIEEE(line[9:]) != sum {
			break
		}
		var r journalRecord
		if err := json.Unmarshal(line[9:], &r); err != nil || (r.Op != journalSet && r.Op != journalDrop) {
			break
		}
		recs = append(recs, r)
		good += end + 1
	}
	return recs, good
}

// apply applies r to leases (by MAC) and at (the MAC on each address): a
// set takes the address over from any other MAC, as Commit does. Leases
// on addresses that usable refuses are dropped.
func (r journalRecord) apply(leases map[string]*Lease, at map[netip.Addr]string, usable func(netip.Addr) bool) {
	mac, err := normMAC(r.Lease.MAC)
	if err != nil {
		return
	}
	if old, ok := leases[mac]; ok {
		if at[old.IP] == mac {
			delete(at, old.IP)
		}
		delete(leases, mac)
	}
	if r.Op == journalDrop || !usable(r.Lease.IP) {
		return
	}
	if o, ok := at[r.Lease.IP]; ok {
		delete(leases, o)
	}
	l := r.Lease
	l.MAC = mac
	leases[mac] = &l
	at[l.IP] = mac
}

// leaseFileOptions place a network's lease files: readable by all (the
// leases are in status anyway), in a directory made 0755.
var leaseFileOptions = atomicfile.Options{Perm: 0o644, DirPerm: 0o755}

// writeFileAtomic replaces path with data (atomicfile.Write).
func writeFileAtomic(path string, data []byte) error {
	return atomicfile.Write(path, data, leaseFileOptions)
}

// leaseRef is a lease of the range in byExpiry.
type leaseRef struct {
	mac string
	ip  netip.Addr
	exp time.Time
	idx int
}

type expiryHeap []*leaseRef

func (h expiryHeap) Len() int { return len(h) }
func (h expiryHeap) Less(i, j int) bool {
	return cmp.Or(h[i].exp.Compare(h[j].exp), h[i].ip.Compare(h[j].ip)) < 0
}
func (h expiryHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *expiryHeap) Push(x any) {
	r := x.(*leaseRef)
	r.idx = len(*h)
	*h = append(*h, r)
}
func (h *expiryHeap) Pop() any {
	old := *h
	r := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	r.idx = -1
	return r
}

// quarantined is a declined address in untilHeap; entries whose address
// was declined again later are stale and skipped when popped.
type quarantined struct {
	ip    netip.Addr
	until time.Time
}

type untilHeap []quarantined

func (h untilHeap) Len() int           { return len(h) }
func (h untilHeap) Less(i, j int) bool { return h[i].until.Before(h[j].until) }
func (h untilHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *untilHeap) Push(x any)        { *h = append(*h, x.(quarantined)) }
func (h *untilHeap) Pop() any {
	old := *h
	q := old[len(old)-1]
	*h = old[:len(old)-1]
	return q
}

// bitTree is a set of n bits that finds the first clear bit at or after
// a position in O(log₆₄ n): levels[0] holds the bits, and bit j of
// levels[k+1] is set when word j of levels[k] is all ones. Bits past the
// end of each level are set, so they are never found.
type bitTree struct {
	n      uint32
	levels [][]uint64
}

func newBitTree(n uint32) *bitTree {
	t := &bitTree{n: n}
	size := uint64(n)
	for {
		words := max((size+63)/64, 1)
		t.levels = append(t.levels, make([]uint64, words))
		if words == 1 {
			break
		}
		size = words
	}
	meaningful := uint64(n)
	for k, lv := range t.levels {
		for i := meaningful; i < uint64(len(lv))*64; i++ {
			t.setAt(k, i)
		}
		meaningful = uint64(len(lv))
	}
	return t
}

func (t *bitTree) setAt(k int, i uint64) {
	w := &t.levels[k][i/64]
	*w |= 1 << (i % 64)
	if *w == ^uint64(0) && k+1 < len(t.levels) {
		t.setAt(k+1, i/64)
	}
}

func (t *bitTree) clearAt(k int, i uint64) {
	w := &t.levels[k][i/64]
	full := *w == ^uint64(0)
	*w &^= 1 << (i % 64)
	if full && k+1 < len(t.levels) {
		t.clearAt(k+1, i/64)
	}
}

func (t *bitTree) set(i uint32)   { t.setAt(0, uint64(i)) }
func (t *bitTree) clear(i uint32) { t.clearAt(0, uint64(i)) }
func (t *bitTree) has(i uint32) bool {
	return t.levels[0][i/64]&(1<<(i%64)) != 0
}

// next returns the first clear bit at or after i.
func (t *bitTree) next(i uint32) (uint32, bool) {
	if i >= t.n {
		return 0, false
	}
	k, pos := 0, uint64(i)
	for {
		lv := t.levels[k]
		if pos/64 < uint64(len(lv)) {
			if free := ^lv[pos/64] &^ (1<<(pos%64) - 1); free != 0 {
				pos = pos/64*64 + uint64(bits.TrailingZeros64(free))
				break
			}
		}
		// Nothing clear in the rest of this word: look for the next
		// word that is not full, one level up.
		k++
		if k == len(t.levels) {
			return 0, false
		}
		pos = pos/64 + 1
		if pos/64 >= uint64(len(t.levels[k])) {
			return 0, false
		}
	}
	for ; k > 0; k-- {
		pos = pos*64 + uint64(bits.TrailingZeros64(^t.levels[k-1][pos])) // pos is a word of level k-1
	}
	return uint32(pos), true
}
