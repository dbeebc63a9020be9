package guard

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/guestlog"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/nd6"
	"github.com/vmnetctl/vmnetctl/routeradv"
)

// The guard's IPv6 side. VMs make their own IPv6 addresses (SLAAC), so
// the network cannot hand them out as DHCP does IPv4; it learns them
// instead, first come first served (RFC 6620's idea, simplified): the
// learner (nd6_linux.go) hears a VM claim an address in neighbour
// discovery, and the address is that VM's MAC's while the VM keeps using
// it. The bindings are four sets of the guard table:
//
//	set addrs6    (MAC, IPv6) pairs: sources a VM may use
//	set owned6    the addresses bound to any VM
//	set targets6  the same pairs, typed as the target of a neighbour
//	              advertisement (@th,64,128), which nftables cannot name
//	set ownedt6   the owned addresses, typed likewise
//
// and a port's chain (port6Rules) lets a VM send from an address bound to
// its MAC; from an address nobody owns, neighbour discovery only (how the
// learner hears of a new address); never from another VM's address; and
// never advertise another VM's address.
const (
	SetAddrs6   = "addrs6"
	guardOwned6 = "owned6"
	SetTargets6 = "targets6"
	SetOwnedT6  = "ownedt6"
	// Constant sets of the ports' rules (guardL2Types): ICMPv6 types,
	// and the prefixes a VM may claim an address in.
	guardRA6      = "ra6"      // router advertisements and redirects
	guardND6      = "nd6"      // what the learner hears
	guardDAD6     = "dad6"     // what a VM sends before it has an address
	guardUnbound6 = "unbound6" // fe80::/64 and the network's prefix
)

// The ICMPv6 types of guardRA6, guardND6 and guardDAD6.
var (
	icmp6RA  = []string{"nd-router-advert", "nd-redirect"}
	icmp6ND  = []string{"nd-neighbor-solicit", "nd-neighbor-advert", "nd-router-solicit", "mld-listener-report", "mld2-listener-report"}
	icmp6DAD = []string{"nd-neighbor-solicit", "mld-listener-report", "mld2-listener-report"}
)

// constSet adds to tx the set name of type typ with exactly elems.
func constSet(tx *knftables.Transaction, name, typ string, elems []string) {
	tx.Add(&knftables.Set{Name: name, Type: typ})
	tx.Flush(&knftables.Set{Name: name})
	for _, e := range elems {
		tx.Add(&knftables.Element{Set: name, Key: []string{e}})
	}
}

// ndTarget is the target address of a neighbour solicitation or
// advertisement: 128 bits after the ICMPv6 header's first 64.
const ndTarget = "@th,64,128"

// ChecksIPv6 reports whether n's guard checks IPv6 sources: networks with
// an IPv6 side, where the learner runs.
func ChecksIPv6(n *api.Network) bool { return Guarded(n) && n.HasIPv6() }

// addGuard6Sets adds n's IPv6 binding sets to tx.
func addGuard6Sets(tx *knftables.Transaction, n *api.Network) {
	// Router advertisements are dropped on every guarded network.
	constSet(tx, guardRA6, "icmpv6_type", icmp6RA)
	if !ChecksIPv6(n) {
		return
	}
	constSet(tx, guardND6, "icmpv6_type", icmp6ND)
	constSet(tx, guardDAD6, "icmpv6_type", icmp6DAD)
	// The network's prefix may change with networks.yaml: made again.
	tx.Add(&knftables.Set{Name: guardUnbound6, Type: "ipv6_addr", Flags: []knftables.SetFlag{knftables.IntervalFlag}})
	tx.Flush(&knftables.Set{Name: guardUnbound6})
	for _, p := range []string{"fe80::/64", n.Subnet6.String()} {
		tx.Add(&knftables.Element{Set: guardUnbound6, Key: []string{p}})
	}
	tx.Add(&knftables.Set{Name: SetAddrs6, Type: "ether_addr . ipv6_addr"})
	tx.Add(&knftables.Set{Name: guardOwned6, Type: "ipv6_addr"})
	tx.Add(&knftables.Set{Name: SetTargets6, TypeOf: "ether saddr . " + ndTarget})
	tx.Add(&knftables.Set{Name: SetOwnedT6, TypeOf: ndTarget})
}

// port6Rules are a port's IPv6 checks, after its MAC's; drop drops and
// counts. Every frame they see comes from the port's one MAC (its mac-
// set), which no other port of the network may hold (claimed), and the
// learner hears only frames the guard let through: the bindings keyed by
// ether saddr are that port's alone.
func port6Rules(n *api.Network, drop string) []string {
	switch {
	case Guarded(n) && !n.HasIPv6():
		// `ipv6: false`: no IPv6 between VMs either. Not counted as
		// spoofing: guests send router solicitations and address
		// detection on their own.
		return []string{"ether type ip6 drop"}
	case !ChecksIPv6(n):
		return []string{"ether type ip6 accept"}
	}
	// Each rule names the Ethernet type, as portRules' do: one way of
	// matching the protocol throughout (the first rule of the chain let
	// no tagged frame through).
	ip6 := "ether type ip6 "
	nd := "icmpv6 type @" + guardND6
	owned := ndTarget + " @" + SetOwnedT6
	notMine := "ether saddr . " + ndTarget + " != @" + SetTargets6
	return []string{
		// ICMPv6 in fragments: neighbour discovery must not be
		// fragmented (RFC 6980), and a fragment would hide the target
		// the rules below check, past the first fragment's 8 bytes.
		ip6 + "exthdr frag exists meta l4proto ipv6-icmp " + drop,
		// Another VM's address is not this one's to advertise, nor to
		// contest in duplicate address detection (which would keep the
		// owner from using it).
		ip6 + "icmpv6 type nd-neighbor-advert " + notMine + " " + owned + " " + drop,
		ip6 + "ip6 saddr :: icmpv6 type nd-neighbor-solicit " + notMine + " " + owned + " " + drop,
		ip6 + "ether saddr . ip6 saddr @" + SetAddrs6 + " accept",
		ip6 + "ip6 saddr @" + guardOwned6 + " " + drop,
		// Duplicate address detection and MLD before a VM has an address.
		// At a bounded rate: each new target costs the learner a
		// binding, and its transaction.
		ip6 + "ip6 saddr :: icmpv6 type @" + guardDAD6 + " " + Meter(guardDAD6Rate, "limit rate "+nd6UnboundRate) + " accept",
		// From an address nobody owns: neighbour discovery, which the
		// learner hears, and nothing else until it has bound it; at a
		// bounded rate, as each new source costs the host a neighbour
		// entry (a flood would fill its table).
		ip6 + "ip6 saddr @" + guardUnbound6 + " " + nd + " " + Meter(guardND6Rate, "limit rate "+nd6UnboundRate) + " accept",
		ip6 + drop,
	}
}

// nd6UnboundRate bounds, per port, the neighbour discovery a VM sends from
// addresses nobody owns yet: a booting guest sends a handful; a flood of
// new sources would fill the host's neighbour table.
const nd6UnboundRate = "20/second burst 40 packets"

// Guard6 keeps the IPv6 sets equal to the learner's bindings.
type Guard6 struct {
	n       *api.Network
	nft     knftables.Interface
	inNS    func(func() error) error
	log     *slog.Logger
	Learner *nd6.Learner
	kick    func() // a binding changed (the VMs' egress policies follow their addresses)
	// admit, if set, runs before the guard lets a VM send from an address
	// it newly bound: the VMs' own egress policies take the address in
	// first, so that no packet from it is judged by the network's policy
	// instead (as DHCP's bound runs before the ACK).
	admit func()

	mu     sync.Mutex // one transaction at a time
	syncMu sync.Mutex // one sync at a time (Sync; not SyncReservedOf)
	// sets are the guard's sets as the kernel described them, by name,
	// read once (applyNL): a VM's attach writes its reservations without
	// asking for them again (a request and a netlink socket each, 0.6 to
	// 2.6 ms of an attach here). Forgotten when a write fails.
	sets    map[string]*nftables.Set
	failLog guestlog.Limit
	// trust is what the last Syncs found the sets equal to (a digest of
	// what they wanted) at which nftables generation: a Sync that wants
	// the same at a generation it can trust reads nothing (an idle
	// network's resync is one small request, not a dump of its sets).
	// Under syncMu.
	trust genTrust
	seed  maphash.Seed
	// wantedAt is the digest of what the sets should hold (wanted) when
	// the learner's version was wantedVer: a Sync at the same version
	// need not work it out again (at 1,000 VMs a network, most of an
	// idle network's resync). Under syncMu.
	wantedAt  uint64
	wantedVer uint64
	wantedOK  bool

	// soon asks resync for a sync within removalDelay: reservations
	// that went (syncReservedOf) leave the sets then, many at once.
	soon      chan struct{}
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// reservedOfMax is the most VMs whose reservations syncReservedOf writes
// without reading the sets; for more, the sync reads them and writes only
// what differs.
const reservedOfMax = 64

// removalDelay is how long the reservations of VMs that left stay in the
// sets, so that many leave in one sync: deleting elements makes the
// kernel rebuild the sets, which costs as much for one as for a thousand.
// The addresses are derived from the MACs of VMs gone; no other VM has a
// claim on them meanwhile.
const removalDelay = time.Second

// nd6Lifetime is how long a VM keeps an address it stopped announcing:
// the valid lifetime of the prefix in the router advertisements, the
// longest a SLAAC address lives without them. Shorter would drop
// addresses that a VM uses only towards other VMs (their neighbour
// discovery is unicast, which the learner does not see); 16 addresses per
// VM bound what stays.
const nd6Lifetime = routeradv.ValidLifetime

// StartGuard6 starts the learner on n's bridge and keeps the sets equal to
// its bindings: at once, on each change it reports, and every guardResync
// (which repairs what a failed update missed). The bindings in the sets
// when it starts (an earlier controller's) are the learner's first: a VM
// whose address was bound keeps it through a restart of vmnetctl, and no
// other VM can take it meanwhile.
func StartGuard6(n *api.Network, log *slog.Logger, inNS func(func() error) error, kick, admit func()) (*Guard6, error) {
	nft, err := hostnet.NFT(knftables.BridgeFamily, n.ID)
	if err != nil {
		return nil, err
	}
	g := &Guard6{n: n, nft: nft, inNS: inNS, log: log, kick: kick, admit: admit, seed: maphash.MakeSeed(), soon: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	ctx := context.Background()
	if err := g.run(ctx, func(*knftables.Transaction) {}); err != nil { // the sets, if missing
		return nil, err
	}
	kept, err := g.pairs(ctx)
	if err != nil {
		return nil, err
	}
	g.Learner, err = nd6.Start(n.Bridge(), n.Subnet6, nd6Lifetime, g.changed, log)
	if err != nil {
		return nil, fmt.Errorf("network %q: learning the VMs' IPv6 addresses: %w", n.ID, err)
	}
	now := time.Now()
	for _, b := range kept {
		if b.reserved {
			continue // a reservation, not an address a VM was heard using
		}
		if mac, err := net.ParseMAC(b.mac); err == nil && len(mac) == 6 {
			g.Learner.Claim([6]byte(mac), b.ip, now)
		}
	}
	if err := g.Sync(ctx); err != nil {
		g.Learner.Close()
		return nil, err
	}
	go g.resync()
	return g, nil
}

// pair is a (MAC, IPv6 address) element of addrs6, the MAC as text.
type pair struct {
	mac string
	ip  netip.Addr
}

// keptPair is a pair as read from the kernel: reserved if it was added for
// a reservation (with the comment reservedComment), not a binding.
type keptPair struct {
	pair
	reserved bool
}

// reservedComment marks the elements of addrs6 and targets6 that are a
// VM's reserved EUI-64 addresses, so that a restart does not take them for
// addresses the VM was heard using (which DNS would answer).
const reservedComment = "reserved"

// pairs reads addrs6 from the kernel.
func (g *Guard6) pairs(ctx context.Context) ([]keptPair, error) {
	// Through netlink: nft would read the whole table first, every
	// port's guard with it.
	var elems []nftables.SetElement
	err := g.inNS(func() (err error) {
		elems, err = SetElements(g.n.ID, SetAddrs6)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("network %q: reading the guard's IPv6 addresses: %w", g.n.ID, err)
	}
	var out []keptPair
	for _, e := range elems {
		// ether_addr . ipv6_addr: the MAC padded to 8 bytes.
		if len(e.Key) != 8+16 {
			continue
		}
		ip := netip.AddrFrom16([16]byte(e.Key[8:]))
		out = append(out, keptPair{pair{net.HardwareAddr(e.Key[:6]).String(), ip}, e.Comment == reservedComment})
	}
	return out, nil
}

// owned reads owned6 from the kernel.
func (g *Guard6) owned(ctx context.Context) (map[netip.Addr]bool, error) {
	var elems []nftables.SetElement
	err := g.inNS(func() (err error) {
		elems, err = SetElements(g.n.ID, guardOwned6)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("network %q: reading the guard's owned IPv6 addresses: %w", g.n.ID, err)
	}
	out := map[netip.Addr]bool{}
	for _, e := range elems {
		if len(e.Key) == 16 {
			out[netip.AddrFrom16([16]byte(e.Key))] = true
		}
	}
	return out, nil
}

// Sync makes the sets what the learner holds, plus the gateway's
// addresses: one transaction, from what the kernel has. targets6 and
// ownedt6 change with addrs6 and owned6, always in one transaction, so
// they hold the same.
func (g *Guard6) Sync(ctx context.Context) error {
	g.syncMu.Lock()
	defer g.syncMu.Unlock()
	// The generation before the sets: a commit between the two reads as
	// a change at the next Sync, never as none.
	began := time.Now()
	var gen uint32
	genErr := g.inNS(func() (err error) {
		gen, err = hostnet.NFTGeneration()
		return err
	})
	// The learner's version before what it holds: a change between the
	// two is a version the next Sync has not seen.
	ver := g.Learner.Version()
	if !g.wantedOK || g.wantedVer != ver {
		g.wantedAt, g.wantedVer, g.wantedOK = g.digest(g.wanted()), ver, true
	}
	if genErr == nil && g.trust.skip(gen, g.wantedAt) {
		return nil
	}
	have, err := g.pairs(ctx)
	if err != nil {
		g.trust.forget()
		return err
	}
	haveOwned, err := g.owned(ctx)
	if err != nil {
		g.trust.forget()
		return err
	}
	// What the sets should hold is read again after them: a reservation
	// that SyncReservedOf added before the read is in it.
	ver = g.Learner.Version()
	want, wantOwned := g.wanted()
	haveSet := map[pair]bool{}
	for _, p := range have {
		haveSet[p.pair] = true
	}
	var ops []elemOp
	for p, reserved := range want {
		if !haveSet[p] {
			ops = append(ops, pairOps(p, reserved, false)...)
		}
	}
	for p := range haveSet {
		if _, ok := want[p]; !ok {
			ops = append(ops, pairOps(p, false, true)...)
		}
	}
	for ip := range wantOwned {
		if !haveOwned[ip] {
			ops = append(ops, ownedOps(ip, false)...)
		}
	}
	for ip := range haveOwned {
		if !wantOwned[ip] {
			ops = append(ops, ownedOps(ip, true)...)
		}
	}
	g.wantedAt, g.wantedVer = g.digest(want, wantOwned), ver
	g.trust.read(gen, g.wantedAt, len(ops) == 0 && genErr == nil, began)
	return g.apply(ctx, ops)
}

// digest is a digest of want and wantOwned (elemHash).
func (g *Guard6) digest(want map[pair]bool, wantOwned map[netip.Addr]bool) uint64 {
	var sum uint64
	var h maphash.Hash
	h.SetSeed(g.seed)
	for p, reserved := range want {
		tag := byte(0)
		if reserved {
			tag = 1
		}
		sum += elemHash(&h, p.mac, p.ip, tag)
	}
	for ip := range wantOwned {
		sum += elemHash(&h, "", ip, 2)
	}
	return sum + uint64(len(want))<<32 + uint64(len(wantOwned))
}

// wanted is what the sets should hold: the learner's reservations and
// bindings, and the gateway's addresses. Sync keeps its digest while the
// learner's version stands: anything else it came to read that could
// change (the gateway's addresses are the network's, fixed while the
// guard lives) would have to move that too.
func (g *Guard6) wanted() (want map[pair]bool, wantOwned map[netip.Addr]bool) {
	want = map[pair]bool{} // true: a reservation
	wantOwned = map[netip.Addr]bool{}
	for _, ip := range gatewayAddrs6(g.n) {
		wantOwned[ip] = true
	}
	// A VM's reserved EUI-64 addresses are its own before it uses them:
	// another VM may not advertise them, nor contest them in duplicate
	// address detection (which would keep the owner from them for good).
	for _, b := range g.Learner.Reserved() {
		want[pair{b.MAC.String(), b.IP}] = true
		wantOwned[b.IP] = true
	}
	for _, b := range g.Learner.Bindings() {
		want[pair{b.MAC.String(), b.IP}] = false
		wantOwned[b.IP] = true
	}
	return want, wantOwned
}

// elemOp is the addition or deletion of one element of the guard's IPv6
// sets, as netlink carries it.
type elemOp struct {
	set     string
	key     []byte
	comment string
	del     bool
}

// pairOps adds p to addrs6 and targets6 (marked as a reservation if
// reserved), or deletes it.
func pairOps(p pair, reserved, del bool) []elemOp {
	mac, _ := net.ParseMAC(p.mac)
	ip := p.ip.As16()
	// ether_addr . ipv6_addr: the MAC padded to 8 bytes. targets6's
	// second field is the raw 128 bits of the target, in network order:
	// the same bytes.
	key := append(append(append([]byte{}, mac...), 0, 0), ip[:]...)
	c := ""
	if reserved && !del {
		c = reservedComment
	}
	return []elemOp{{SetAddrs6, key, c, del}, {SetTargets6, key, c, del}}
}

// ownedOps adds ip to owned6 and ownedt6, or deletes it.
func ownedOps(ip netip.Addr, del bool) []elemOp {
	b := ip.As16()
	return []elemOp{{guardOwned6, b[:], "", del}, {SetOwnedT6, b[:], "", del}}
}

// apply writes ops in one netlink batch (nothing for none): nft would
// read the whole table first, every port's guard with it, for each VM
// that comes or goes. A deletion adds the element first, so that it does
// not fail on one already gone. Without the sets (a table deleted and not
// yet made again), nft makes them first (run).
func (g *Guard6) apply(ctx context.Context, ops []elemOp) error {
	if len(ops) == 0 {
		return nil
	}
	err := g.applyNL(ops)
	if errors.Is(err, errNoSets) {
		if err = g.run(ctx, func(*knftables.Transaction) {}); err == nil {
			err = g.applyNL(ops)
		}
	}
	if err != nil {
		return fmt.Errorf("network %q: updating the guard's IPv6 addresses: %w", g.n.ID, err)
	}
	return nil
}

// applyChunk bounds the operations of one netlink batch: a batch and the
// kernel's acknowledgements of its messages must fit the socket's buffers
// ("message too long", "no buffer space available": the sync of a
// thousand VMs' reservations writes eight thousand elements). Larger
// batches are not atomic; each operation is idempotent.
const applyChunk = 128

// errNoSets is applyNL's report that a set it writes is missing.
var errNoSets = errors.New("the guard's IPv6 sets are missing")

func (g *Guard6) applyNL(ops []elemOp) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	err := g.inNS(func() error {
		// One netlink socket for the whole transaction, not one a request.
		conn, err := nftables.New(nftables.AsLasting())
		if err != nil {
			return err
		}
		defer conn.CloseLasting()
		tbl := &nftables.Table{Name: hostnet.TableName(g.n.ID), Family: nftables.TableFamilyBridge}
		if g.sets == nil {
			g.sets = map[string]*nftables.Set{}
		}
		for _, op := range ops {
			if g.sets[op.set] != nil {
				continue
			}
			set, err := conn.GetSetByName(tbl, op.set)
			if errors.Is(err, unix.ENOENT) {
				return errNoSets
			}
			if err != nil {
				return err
			}
			g.sets[op.set] = set
		}
		for i, op := range ops {
			e := []nftables.SetElement{{Key: op.key, Comment: op.comment}}
			if err := conn.SetAddElements(g.sets[op.set], e); err != nil {
				return err
			}
			if op.del {
				if err := conn.SetDeleteElements(g.sets[op.set], []nftables.SetElement{{Key: op.key}}); err != nil {
					return err
				}
			}
			if (i+1)%applyChunk == 0 {
				if err := flushNL(conn); err != nil {
					return err
				}
			}
		}
		return flushNL(conn)
	})
	if err != nil {
		g.sets = nil // (a table made again: its sets read anew)
	}
	return err
}

// flushNL sends conn's batch; a set that is not there (the table
// deleted since the sets were read) is errNoSets, as when it is read.
func flushNL(conn *nftables.Conn) error {
	err := conn.Flush()
	if errors.Is(err, unix.ENOENT) {
		return errNoSets
	}
	return err
}

// resync runs sync every guardResync, and removalDelay after it is asked
// to (soon), until Close.
func (g *Guard6) resync() {
	defer close(g.done)
	t := time.NewTicker(Resync)
	defer t.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-g.soon:
			select {
			case <-g.stop:
				return
			case <-time.After(removalDelay):
			}
			g.logFailure(g.Sync(context.Background()))
		case <-t.C:
			g.logFailure(g.Sync(context.Background()))
		}
	}
}

// gatewayAddrs6 are the addresses of n's gateway on the bridge: ::1 of the
// prefix, the subnet-router anycast address (the prefix's first), and the
// bridge's link-local address.
func gatewayAddrs6(n *api.Network) []netip.Addr {
	return []netip.Addr{n.Gateway6, n.Subnet6.Masked().Addr(), api.LinkLocal(hostnet.BridgeMAC(n.ID)).Addr()}
}

// changed puts the bindings the learner added or removed into the sets,
// in one transaction. A binding of a reserved address that goes stays in
// them: the address is still its VM's. A failure is mended by the next
// sync.
func (g *Guard6) changed(events []nd6.Event) {
	if g.admit != nil && slices.ContainsFunc(events, func(ev nd6.Event) bool { return ev.Added }) {
		g.admit()
	}
	var ops []elemOp
	for _, ev := range events {
		b := ev.Binding
		if ev.Reserved && ev.Owner == [6]byte(b.MAC) {
			continue
		}
		p := pair{b.MAC.String(), b.IP}
		if ev.Added {
			ops = append(ops, pairOps(p, false, false)...)
			ops = append(ops, ownedOps(b.IP, false)...)
			continue
		}
		// Whether or not a sync removed it meanwhile, or this batch
		// adds and removes it.
		ops = append(ops, pairOps(p, false, true)...)
		if ev.Reserved { // another VM's: it stays owned
			continue
		}
		ops = append(ops, ownedOps(b.IP, true)...)
	}
	err := g.apply(context.Background(), ops)
	g.logFailure(err)
	if g.kick != nil {
		g.kick()
	}
}

// SyncReservedOf puts into the sets the reservations of macs, which
// changed (SetHost, RemoveHost): the EUI-64 addresses of a VM that comes
// are added at once, in one batch and without reading the sets, so that
// it costs its own elements however many VMs the network has; those of
// VMs that went leave in the sync removalDelay later. What this misses (a
// set changed behind vmnetctl's back) the periodic sync mends.
//
// It does not wait for a sync that runs (syncMu): a periodic sync reads
// the network's sets back, for a time that grows with its VMs, and a
// VM's attach would wait for it. A sync beside it cannot undo what it
// adds: the learner holds the reservation before this is called (SetHost
// reserves, the round's end syncs), a sync reads the sets before it reads
// the learner, so a reservation in the sets it read is in what it wants,
// and it deletes only what it read (TestReservationsBesideSyncs). Its
// writes wait only for another transaction (mu).
func (g *Guard6) SyncReservedOf(macs []net.HardwareAddr) {
	if len(macs) > reservedOfMax {
		// A controller's first pass: most are there already.
		g.logFailure(g.Sync(context.Background()))
		return
	}
	var ops []elemOp
	removed := false
	for _, mac := range macs {
		for _, ip := range g.Learner.EUI64(mac) {
			if owner, ok := g.Learner.ReservedFor(ip); !ok || owner != [6]byte(mac) {
				removed = true
				continue
			}
			ops = append(ops, pairOps(pair{mac.String(), ip}, true, false)...)
			ops = append(ops, ownedOps(ip, false)...)
		}
	}
	g.logFailure(g.apply(context.Background(), ops))
	if removed {
		select {
		case g.soon <- struct{}{}:
		default:
		}
	}
}

func (g *Guard6) logFailure(err error) {
	if err == nil {
		return
	}
	if ok, held := g.failLog.Allow(time.Now()); ok {
		g.log.Error("guard: the VMs' IPv6 addresses are not up to date; retrying later", "err", err, "suppressed", held)
	}
}

// run runs one transaction on the guard table, its sets made if missing.
func (g *Guard6) run(ctx context.Context, build func(*knftables.Transaction)) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	tx := g.nft.NewTransaction()
	addGuardSets(tx, g.n)
	build(tx)
	if err := g.inNS(func() error { return g.nft.Run(ctx, tx) }); err != nil {
		return fmt.Errorf("network %q: updating the guard's IPv6 addresses: %w", g.n.ID, err)
	}
	return nil
}

// Close stops the learner and the resync. The sets stay: the next start
// takes them over.
func (g *Guard6) Close() error {
	g.closeOnce.Do(func() {
		close(g.stop)
		<-g.done
	})
	return g.Learner.Close()
}
