// Package nd6 learns the IPv6 addresses a network's VMs use from their
// neighbour discovery messages (first come, first served, bounded, with
// reservations for each VM's EUI-64 addresses), read from a filtered
// packet socket on the bridge.
package nd6

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/net/bpf"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/checksum"
	"github.com/vmnetctl/vmnetctl/guestlog"
	"github.com/vmnetctl/vmnetctl/rawsock"
	"github.com/vmnetctl/vmnetctl/rtlink"
)

// A network's guests configure their IPv6 addresses themselves (SLAAC), so
// the controller learns them: which address each VM (by MAC) uses, for the
// AAAA answers of its name and for the anti-spoofing set that binds
// addresses to MACs. The learner snoops neighbour discovery (RFC 4861) on
// the bridge with a packet socket, as the DHCP server does (dhcpconn_linux.go),
// and binds an address first come, first served (a simplified RFC 6620
// FCFS SAVI): the first MAC to claim it, by duplicate address detection or
// by advertising it, keeps it for as long as it claims it again within the
// lifetime; another MAC's claim meanwhile is refused and counted.
//
// A claim is:
//   - a DAD neighbour solicitation (IPv6 source ::): its target, for the
//     Ethernet source;
//   - a neighbour solicitation from a unicast source: that source;
//   - a neighbour advertisement: its target.
//
// Only valid messages count (RFC 4861 7.1: hop limit 255, code 0, a right
// checksum, well-formed options, no multicast target...), only addresses in
// the network's prefix or in fe80::/64, never one of the bridge's own, and
// never when a link-layer address option of the message names another MAC
// than the frame's Ethernet source.
//
// The learner sees what the bridge passes up to the host: every multicast
// frame (DAD solicitations, address resolution, unsolicited advertisements)
// as long as the bridge floods multicast to the host (multicast snooping off,
// or on with no querier), and unicast frames to the bridge's MAC; not the
// unicast traffic between guests. It relies on the ports' MAC anti-spoofing:
// the Ethernet source is who claims. Frames with a VLAN tag are ignored (no
// one on the network would take them), as are the host's own.

const (
	// nd6MaxPerMAC is how many addresses one MAC may hold: a further claim
	// replaces its least recently claimed one.
	nd6MaxPerMAC = 16
	// nd6MaxBindings is how many bindings a learner holds in all: past it,
	// new claims are ignored (and counted as dropped).
	nd6MaxBindings = 4096
	// nd6MaxSweep is the longest time between two sweeps of expired
	// bindings (a quarter of the lifetime, if less); nd6MinSweep the least.
	nd6MaxSweep = 30 * time.Second
	nd6MinSweep = 50 * time.Millisecond
	// nd6ReadRetry is how long the reader waits after a read fails for
	// another reason than the bridge going down.
	nd6ReadRetry = time.Second
	// nd6Snap is the most of a frame the reader takes: all of it, so that
	// every message a guest's stack would take is seen whole.
	nd6Snap = 0xffff
)

// nd6LinkLocal is the link-local prefix guests' link-local addresses are in.
var nd6LinkLocal = netip.MustParsePrefix("fe80::/64")

// nd6Filter passes IPv6 neighbour solicitations and advertisements with
// hop limit 255 and code 0, without a VLAN tag: what a packet socket of
// type SOCK_DGRAM sees starts at the IPv6 header. Messages behind an
// extension header do not pass (ND has none in practice).
var nd6Filter = []bpf.Instruction{
	/* 0 */ bpf.LoadExtension{Num: bpf.ExtVLANTagPresent},
	/* 1 */ bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: 0, SkipTrue: 9},
	/* 2 */ bpf.LoadAbsolute{Off: 0, Size: 1}, // version
	/* 3 */ bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: 0xf0},
	/* 4 */ bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: 0x60, SkipTrue: 6},
	/* 5 */ bpf.LoadAbsolute{Off: 6, Size: 2}, // next header, hop limit
	/* 6 */ bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: unix.IPPROTO_ICMPV6<<8 | 255, SkipTrue: 4},
	/* 7 */ bpf.LoadAbsolute{Off: ipv6.HeaderLen, Size: 2}, // ICMPv6 type, code
	/* 8 */ bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(ipv6.ICMPTypeNeighborSolicitation) << 8, SkipTrue: 1},
	/* 9 */ bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: uint32(ipv6.ICMPTypeNeighborAdvertisement) << 8, SkipTrue: 1},
	/* 10 */ bpf.RetConstant{Val: nd6Snap},
	/* 11 */ bpf.RetConstant{Val: 0},
}

// Binding is an IPv6 address a VM (by MAC) uses.
type Binding struct {
	MAC     net.HardwareAddr
	IP      netip.Addr
	Expires time.Time
}

// entry is a binding as the learner holds it.
type entry struct {
	mac     [6]byte
	expires time.Time
}

// Event is a change onChange is told of, in a batch.
type Event struct {
	Binding Binding
	Added   bool
	// Reserved: the address of a binding that went is reserved (for
	// Owner), so it stays owned in the guard; the pair too if Owner is
	// the binding's MAC.
	Reserved bool
	Owner    [6]byte
}

// Learner learns VMs' IPv6 addresses in prefix from neighbour discovery
// on iface. One goroutine reads the socket, applies the claims, sweeps the
// expired bindings and calls onChange; the other methods may be called from
// any goroutine.
type Learner struct {
	iface    string
	prefix   netip.Prefix
	lifetime time.Duration
	sweep    time.Duration
	onChange func([]Event)
	log      *slog.Logger

	file  *os.File        // the packet socket, in Go's poller
	nl    *netlink.Handle // in the interface's namespace, for refresh
	addrs *rtlink.Conn    // the same, for the interface's addresses alone
	index int             // the interface's index

	mu      sync.Mutex
	byIP    map[netip.Addr]*entry
	byMAC   map[[6]byte][]netip.Addr // at most nd6MaxPerMAC each
	pending []Event                  // for onChange, in order
	own     [6]byte                  // the interface's MAC
	hostIPs map[netip.Addr]bool      // the interface's addresses
	// reserved are the EUI-64 addresses (link-local and in the prefix)
	// of the VMs' expected MACs (Reserve): no other MAC may claim them,
	// even before their VM boots.
	reserved map[netip.Addr][6]byte
	// version counts the changes of the bindings (which MAC holds which
	// address) and the reservations (Version): bumped under mu, in the
	// same critical section as the change, so that a version names one
	// state.
	version uint64

	claims, conflicts, dropped atomic.Uint64
	fullLog                    guestlog.Limit

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error
}

// newTable is a learner without a socket: the bindings and their rules.
func newTable(prefix netip.Prefix, lifetime time.Duration, onChange func([]Event), log *slog.Logger) (*Learner, error) {
	if !prefix.IsValid() || !prefix.Addr().Is6() || prefix.Addr().Is4In6() || prefix.Bits() != 64 {
		return nil, fmt.Errorf("prefix %s is not an IPv6 /64", prefix)
	}
	if lifetime <= 0 {
		return nil, fmt.Errorf("binding lifetime %v is not positive", lifetime)
	}
	if log == nil {
		log = slog.Default()
	}
	return &Learner{
		prefix:   prefix.Masked(),
		lifetime: lifetime,
		sweep:    max(min(lifetime/4, nd6MaxSweep), nd6MinSweep),
		onChange: onChange,
		log:      log,
		byIP:     map[netip.Addr]*entry{},
		byMAC:    map[[6]byte][]netip.Addr{},
		hostIPs:  map[netip.Addr]bool{},
		reserved: map[netip.Addr][6]byte{},
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}, nil
}

// Start opens the packet socket on iface and learns bindings of
// addresses inside prefix (a /64) and link-local fe80::/64 addresses, for
// lifetime after their last claim. onChange, if not nil, is called (from
// the learner's goroutine, never concurrently with itself) with each
// binding added or removed (removed: added=false), in order; it must not
// call Close.
//
// Call it in the network namespace of the interface: the sockets stay in it.
func Start(iface string, prefix netip.Prefix, lifetime time.Duration, onChange func([]Event), log *slog.Logger) (*Learner, error) {
	if log == nil {
		log = slog.Default()
	}
	l, err := newTable(prefix, lifetime, onChange, log.With("iface", iface))
	if err != nil {
		return nil, fmt.Errorf("IPv6 address learning on %s: %w", iface, err)
	}
	l.iface = iface
	if err := l.open(); err != nil {
		return nil, fmt.Errorf("IPv6 address learning on %s: %w", iface, err)
	}
	go l.run()
	l.log.Debug("learning IPv6 addresses", "prefix", l.prefix, "lifetime", lifetime)
	return l, nil
}

// open opens the netlink handle and the packet socket, and reads the
// interface's MAC and addresses.
func (l *Learner) open() error {
	nl, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	link, err := nl.LinkByName(l.iface)
	if err != nil {
		nl.Close()
		return err
	}
	addrs, err := rtlink.Open()
	if err != nil {
		nl.Close()
		return err
	}
	l.nl, l.addrs, l.index = nl, addrs, link.Attrs().Index
	if err := l.refreshHost(); err != nil {
		nl.Close()
		addrs.Close()
		return err
	}
	// The filter comes before bind, so no other packet is ever queued.
	if l.file, err = rawsock.Listen(l.index, unix.ETH_P_IPV6, nd6Filter, "nd6"); err != nil {
		nl.Close()
		addrs.Close()
		return fmt.Errorf("packet socket: %w", err)
	}
	return nil
}

// refreshHost reads the interface's MAC and addresses again (a bridge's
// MAC may follow its ports) and drops any binding of one of its addresses.
func (l *Learner) refreshHost() error {
	link, err := l.nl.LinkByIndex(l.index)
	if err != nil {
		return err
	}
	// Of the interface alone: an address dump of the host walks every
	// link, at every sweep of every network's learner.
	addrs, err := l.addrs.Addrs(l.index, unix.AF_INET6)
	if err != nil {
		return err
	}
	host := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		host[a.Prefix.Addr().Unmap()] = true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.own = [6]byte{}
	copy(l.own[:], link.Attrs().HardwareAddr)
	l.hostIPs = host
	for ip := range host {
		if e := l.byIP[ip]; e != nil {
			l.remove(ip, e)
		}
	}
	return nil
}

// run is the learner's goroutine: it reads until Close.
func (l *Learner) run() {
	defer close(l.done)
	buf := make([]byte, nd6Snap)
	raw, err := l.file.SyscallConn()
	if err != nil {
		l.log.Error("IPv6 address learning stopped", "err", err)
		return
	}
	nextSweep := time.Now().Add(l.sweep)
	for {
		// The deadline before the pending events: Forget queues its
		// events, then sets the deadline to now to have them sent.
		l.file.SetReadDeadline(nextSweep)
		l.deliver()
		n, from, err := rawsock.RecvFrom(raw, buf)
		select {
		case <-l.stop:
			return
		default:
		}
		now := time.Now()
		switch {
		case err == nil:
			l.frame(buf[:n], from, now)
		case errors.Is(err, os.ErrDeadlineExceeded):
		case errors.Is(err, unix.ENETDOWN):
			// Reported once as the interface goes down; the socket reads
			// again when it is up.
			l.log.Debug("interface down")
		default:
			l.log.Warn("reading neighbour discovery", "err", err)
			select {
			case <-l.stop:
				return
			case <-time.After(nd6ReadRetry):
			}
		}
		if !now.Before(nextSweep) {
			l.expire(now)
			if err := l.refreshHost(); err != nil {
				l.log.Debug("reading the interface's addresses", "err", err)
			}
			nextSweep = now.Add(l.sweep)
		}
	}
}

// frame applies what the packet socket read from from.
func (l *Learner) frame(pkt []byte, from unix.Sockaddr, now time.Time) {
	ll, ok := from.(*unix.SockaddrLinklayer)
	if !ok || ll.Halen != 6 {
		return
	}
	switch ll.Pkttype {
	case unix.PACKET_HOST, unix.PACKET_BROADCAST, unix.PACKET_MULTICAST:
	default: // the host's own (outgoing, looped back) or not for it
		return
	}
	var mac [6]byte
	copy(mac[:], ll.Addr[:6])
	if mac[0]&1 != 0 || mac == [6]byte{} {
		return
	}
	ip, err := parseND6(pkt, mac)
	if err != nil {
		return
	}
	l.Claim(mac, ip, now)
}

// Errors of parseND6: the message is not a valid claim.
var (
	errND6Invalid = errors.New("not a valid neighbour discovery message")
	errND6LLA     = errors.New("a link-layer address option is not the Ethernet source")
)

// parseND6 returns the address a neighbour solicitation or advertisement
// pkt (from its IPv6 header on) claims for the Ethernet address src: the
// target of a DAD solicitation or of an advertisement, the source of
// another solicitation. It checks what RFC 4861 7.1 asks a node to check,
// bounds first.
func parseND6(pkt []byte, src [6]byte) (netip.Addr, error) {
	const bodyLen = 24 // type, code, checksum, flags, target
	if len(pkt) < ipv6.HeaderLen+bodyLen || pkt[0]>>4 != 6 ||
		pkt[6] != unix.IPPROTO_ICMPV6 || pkt[7] != 255 {
		return netip.Addr{}, errND6Invalid
	}
	plen := int(binary.BigEndian.Uint16(pkt[4:6]))
	if plen < bodyLen || ipv6.HeaderLen+plen > len(pkt) {
		return netip.Addr{}, errND6Invalid
	}
	from := netip.AddrFrom16([16]byte(pkt[8:24]))
	to := netip.AddrFrom16([16]byte(pkt[24:40]))
	m := pkt[ipv6.HeaderLen : ipv6.HeaderLen+plen]
	typ := ipv6.ICMPType(m[0])
	if (typ != ipv6.ICMPTypeNeighborSolicitation && typ != ipv6.ICMPTypeNeighborAdvertisement) ||
		m[1] != 0 || Checksum(pkt[8:40], m) != 0 {
		return netip.Addr{}, errND6Invalid
	}
	target := netip.AddrFrom16([16]byte(m[8:24]))
	if target.IsMulticast() || target.IsUnspecified() || from.IsMulticast() {
		return netip.Addr{}, errND6Invalid
	}
	// The options: each of a non-zero length within the message. The one
	// that names the sender's link-layer address (source in a
	// solicitation, target in an advertisement) must name src.
	llaType := byte(1)
	if typ == ipv6.ICMPTypeNeighborAdvertisement {
		llaType = 2
	}
	hasLLA, otherLLA := false, false
	for o := m[bodyLen:]; len(o) > 0; {
		if len(o) < 2 || o[1] == 0 || int(o[1])*8 > len(o) {
			return netip.Addr{}, errND6Invalid
		}
		n := int(o[1]) * 8
		if o[0] == llaType {
			if n != 8 {
				return netip.Addr{}, errND6Invalid
			}
			hasLLA = true
			otherLLA = otherLLA || [6]byte(o[2:8]) != src
		}
		o = o[n:]
	}
	if typ == ipv6.ICMPTypeNeighborAdvertisement {
		// 7.1.2: no solicited flag in one sent to a multicast address.
		if to.IsMulticast() && m[4]&0x40 != 0 {
			return netip.Addr{}, errND6Invalid
		}
		if otherLLA {
			return netip.Addr{}, errND6LLA
		}
		return target, nil
	}
	if from.IsUnspecified() {
		// 7.1.1: DAD goes to a solicited-node address, with no source
		// link-layer address option.
		if !isSolicitedNode(to) || hasLLA {
			return netip.Addr{}, errND6Invalid
		}
		return target, nil
	}
	if otherLLA {
		return netip.Addr{}, errND6LLA
	}
	return from, nil
}

// isSolicitedNode reports whether a is a solicited-node multicast address
// (ff02::1:ffXX:XXXX).
func isSolicitedNode(a netip.Addr) bool {
	b := a.As16()
	return a.Is6() && [13]byte(b[:13]) == [13]byte{0xff, 0x02, 11: 0x01, 12: 0xff}
}

// Checksum is the ICMPv6 checksum of msg between the source and
// destination addresses addrs (32 bytes): 0 for a message whose checksum
// field is right, the value to put there for one whose field is 0.
func Checksum(addrs, msg []byte) uint16 {
	// The rest of the pseudo-header: the length and the next header.
	var rest [8]byte
	binary.BigEndian.PutUint32(rest[:], uint32(len(msg)))
	rest[7] = unix.IPPROTO_ICMPV6
	return checksum.Of(addrs, rest[:], msg)
}

// learnable reports whether ip may be bound to a guest: a unicast address
// in the prefix or in fe80::/64 with a non-zero interface identifier (not
// the subnet-router anycast address), and not one of the host's.
// Call with l.mu held.
func (l *Learner) learnable(ip netip.Addr) bool {
	if !l.prefix.Contains(ip) && !nd6LinkLocal.Contains(ip) {
		return false
	}
	b := ip.As16()
	return [8]byte(b[8:]) != [8]byte{} && !l.hostIPs[ip]
}

// Claim applies mac's claim of ip at time now: first come, first served.
func (l *Learner) Claim(mac [6]byte, ip netip.Addr, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.learnable(ip) || mac == l.own {
		return
	}
	l.claims.Add(1)
	if owner, ok := l.reserved[ip]; ok && owner != mac {
		l.conflicts.Add(1)
		l.log.Debug("address is another VM's EUI-64 address", "ip", ip,
			"owner", net.HardwareAddr(owner[:]).String(), "claimant", net.HardwareAddr(mac[:]).String())
		return
	}
	if e := l.byIP[ip]; e != nil {
		switch {
		case e.mac == mac:
			e.expires = now.Add(l.lifetime)
			return
		case now.Before(e.expires):
			l.conflicts.Add(1)
			l.log.Debug("address already bound to another MAC", "ip", ip,
				"owner", net.HardwareAddr(e.mac[:]).String(), "claimant", net.HardwareAddr(mac[:]).String())
			return
		default: // expired, not yet swept
			l.remove(ip, e)
		}
	}
	if held := l.byMAC[mac]; len(held) >= nd6MaxPerMAC {
		oldest := held[0]
		for _, a := range held[1:] {
			if l.byIP[a].expires.Before(l.byIP[oldest].expires) {
				oldest = a
			}
		}
		l.log.Debug("too many addresses for one MAC, replacing the least recently claimed",
			"mac", net.HardwareAddr(mac[:]).String(), "replaced", oldest, "ip", ip)
		l.remove(oldest, l.byIP[oldest])
	} else if len(l.byIP) >= nd6MaxBindings {
		l.dropped.Add(1)
		if ok, held := l.fullLog.Allow(now); ok {
			l.log.Warn("too many IPv6 bindings, ignoring new ones", "max", nd6MaxBindings,
				"ip", ip, "mac", net.HardwareAddr(mac[:]).String(), "suppressed", held)
		}
		return
	}
	e := &entry{mac: mac, expires: now.Add(l.lifetime)}
	l.byIP[ip] = e
	l.version++
	l.byMAC[mac] = append(l.byMAC[mac], ip)
	l.log.Debug("learned IPv6 address", "ip", ip, "mac", net.HardwareAddr(mac[:]).String())
	l.queue(ip, e, true)
}

// Reserve keeps the EUI-64 addresses of mac (its link-local address and
// its SLAAC address in the prefix) for mac, or, with reserve false, lets
// them go. vmnetctl's default MACs are predictable (a hash of the VM's
// name): without this, a VM could claim another VM's addresses before that
// VM boots. A binding of them to another MAC goes at once.
func (l *Learner) Reserve(hw net.HardwareAddr, reserve bool) (changed bool) {
	if len(hw) != 6 {
		return false
	}
	mac := [6]byte(hw)
	removed := false
	l.mu.Lock()
	for _, ip := range l.EUI64(hw) {
		owner, had := l.reserved[ip]
		if !reserve {
			if had && owner == mac {
				delete(l.reserved, ip)
				changed = true
				l.version++
			}
			continue
		}
		if !had || owner != mac {
			changed = true
			l.version++
		}
		l.reserved[ip] = mac
		if e := l.byIP[ip]; e != nil && e.mac != mac {
			l.remove(ip, e)
			removed = true
		}
	}
	l.mu.Unlock()
	if removed && l.file != nil && l.onChange != nil {
		// Wake the reader, to deliver the removals now (as Forget does).
		l.file.SetReadDeadline(time.Now())
	}
	return changed
}

// Version counts the changes of what Reserved and Bindings return, but
// the bindings' expiries: while it stands, they return the same pairs.
func (l *Learner) Version() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.version
}

// Reserved returns the reserved EUI-64 addresses with their MACs.
func (l *Learner) Reserved() []Binding {
	l.mu.Lock()
	defer l.mu.Unlock()
	bs := make([]Binding, 0, len(l.reserved))
	for ip, mac := range l.reserved {
		bs = append(bs, Binding{MAC: net.HardwareAddr(append([]byte(nil), mac[:]...)), IP: ip})
	}
	return bs
}

// EUI64 is the addresses Reserve reserves for hw: its link-local
// address and its SLAAC address in the network's prefix.
func (l *Learner) EUI64(hw net.HardwareAddr) []netip.Addr {
	ll := api.LinkLocal(hw).Addr().As16()
	slaac := l.prefix.Addr().As16()
	copy(slaac[8:], ll[8:])
	return []netip.Addr{netip.AddrFrom16(ll), netip.AddrFrom16(slaac)}
}

// ReservedFor tells the MAC ip is reserved for, if any.
func (l *Learner) ReservedFor(ip netip.Addr) (mac [6]byte, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	mac, ok = l.reserved[ip]
	return mac, ok
}

// remove drops the binding e of ip. Call with l.mu held.
func (l *Learner) remove(ip netip.Addr, e *entry) {
	delete(l.byIP, ip)
	l.version++
	held := slices.DeleteFunc(l.byMAC[e.mac], func(a netip.Addr) bool { return a == ip })
	if len(held) == 0 {
		delete(l.byMAC, e.mac)
	} else {
		l.byMAC[e.mac] = held
	}
	l.queue(ip, e, false)
}

// queue adds a change for onChange. Call with l.mu held.
func (l *Learner) queue(ip netip.Addr, e *entry, added bool) {
	if l.onChange != nil {
		owner, ok := l.reserved[ip]
		l.pending = append(l.pending, Event{Binding: e.binding(ip), Added: added, Reserved: !added && ok, Owner: owner})
	}
}

func (e *entry) binding(ip netip.Addr) Binding {
	return Binding{MAC: net.HardwareAddr(append([]byte(nil), e.mac[:]...)), IP: ip, Expires: e.expires}
}

// deliver calls onChange with the pending changes, outside the lock. Only
// the learner's goroutine calls it.
func (l *Learner) deliver() {
	for {
		l.mu.Lock()
		events := l.pending
		l.pending = nil
		l.mu.Unlock()
		if len(events) == 0 {
			return
		}
		l.onChange(events)
	}
}

// expire drops the bindings that expired by now.
func (l *Learner) expire(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for ip, e := range l.byIP {
		if !now.Before(e.expires) {
			l.log.Debug("IPv6 binding expired", "ip", ip, "mac", net.HardwareAddr(e.mac[:]).String())
			l.remove(ip, e)
		}
	}
}

// Lookup returns the addresses in prefix bound to mac (for AAAA answers),
// sorted.
func (l *Learner) Lookup(mac net.HardwareAddr) []netip.Addr {
	if len(mac) != 6 {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var ips []netip.Addr
	for _, ip := range l.byMAC[[6]byte(mac)] {
		if l.prefix.Contains(ip) {
			ips = append(ips, ip)
		}
	}
	slices.SortFunc(ips, netip.Addr.Compare)
	return ips
}

// Owner returns the MAC an address is bound to.
func (l *Learner) Owner(ip netip.Addr) (net.HardwareAddr, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.byIP[ip]
	if e == nil {
		return nil, false
	}
	return net.HardwareAddr(append([]byte(nil), e.mac[:]...)), true
}

// Bindings returns all current bindings (for resync), by address.
func (l *Learner) Bindings() []Binding {
	l.mu.Lock()
	defer l.mu.Unlock()
	bs := make([]Binding, 0, len(l.byIP))
	for ip, e := range l.byIP {
		bs = append(bs, e.binding(ip))
	}
	slices.SortFunc(bs, func(a, b Binding) int { return a.IP.Compare(b.IP) })
	return bs
}

// Forget drops every binding of mac (its VM left the network) at once;
// onChange is told of each soon after, from the learner's goroutine.
func (l *Learner) Forget(mac net.HardwareAddr) {
	if len(mac) != 6 {
		return
	}
	l.mu.Lock()
	held := slices.Clone(l.byMAC[[6]byte(mac)])
	for _, ip := range held {
		l.remove(ip, l.byIP[ip])
	}
	l.mu.Unlock()
	if len(held) > 0 && l.file != nil && l.onChange != nil {
		// Wake the reader, to deliver the removals now.
		l.file.SetReadDeadline(time.Now())
	}
}

// Stats returns how many claims the learner considered (valid ND messages
// for a learnable address), how many it refused because another MAC held
// the address, and how many it dropped because it held nd6MaxBindings.
func (l *Learner) Stats() (claims, conflicts, dropped uint64) {
	return l.claims.Load(), l.conflicts.Load(), l.dropped.Load()
}

// Close stops the learner and waits for its goroutine. Bindings are kept
// (and no removal reported): Lookup still answers.
func (l *Learner) Close() error {
	l.closeOnce.Do(func() {
		close(l.stop)
		if l.file == nil {
			return
		}
		l.closeErr = l.file.Close() // a read under way returns
		<-l.done
		l.nl.Close()
		l.addrs.Close()
	})
	return l.closeErr
}
