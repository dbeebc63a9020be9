package arplearn

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	vnl "github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/guard"
	"github.com/vmnetctl/vmnetctl/guestlog"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/leases"
	"github.com/vmnetctl/vmnetctl/rawsock"
)

// A VM that gives itself an address (a static address,
// vmnet-helper's clients' way, cloud-init's) is let use it once it
// announces it by ARP, if the address is free (leases.Allocator.Learn).
// The guard drops an ARP whose sender address is not bound to the port's
// MAC, as before, and copies it (a bounded number a second per port) to
// the learner through NFLOG: no such ARP ever reaches another VM, so none
// can poison their caches, and the guest's next ARP (it retries every
// second) passes once the address is bound. The learned address is a lease
// marked learned: the guard, status, DNS names and forwards follow it as
// they follow a DHCP lease, and DHCP's clients come first.

const (
	learnCopyRange = 64 // an ARP packet is 28 bytes
	// learnHold is how soon a MAC that learned an address may learn
	// another: each binding costs a journal write and the guard's
	// transaction, which a guest cycling addresses would ask for at the
	// guard's rate.
	learnHold            = 30 * time.Second
	arpHeaderLen         = 28
	arpEthernetIPv4Types = 0x0001_0800
)

// Config is what a network gives its learner.
type Config struct {
	Network *api.Network
	Alloc   *leases.Allocator // binds (Learn) and knows what is bound
	Guard   *guard.AddrGuard  // synced again for an address bound already
	// InNS runs f in the network's namespace.
	InNS func(f func() error) error
	Log  *slog.Logger
	// Bound has the guard, the VMs' egress policies and the forwards
	// follow mac's new address, before the VM hears of it.
	Bound func(mac net.HardwareAddr)
	// OnLease, if set, is told of each address learned
	// ("address-learned").
	OnLease func(kind, network, mac string, ip netip.Addr)
}

// Learner is a network's IPv4 address learner. Its methods may be called
// on nil (a network that does not learn).
type Learner struct {
	n         *api.Network
	alloc     *leases.Allocator
	guard     *guard.AddrGuard
	inNS      func(f func() error) error
	log       *slog.Logger
	bound     func(mac net.HardwareAddr)
	onLease   func(kind, network, mac string, ip netip.Addr)
	logLimit  guestlog.Limit // the learner's lines
	answerLog guestlog.Limit // its failures to answer for the gateway: not hidden by a binding's line
	known     atomic.Bool    // the network's VMs are known (VMsKnown): it may bind
	mu        sync.Mutex
	learnedAt map[string]time.Time // by MAC: its last learned address (learnHeld)
	deferred  []deferredClaim      // claims heard before VMsKnown (deferClaim), under mu
	conn      *hostnet.NFLOG
	stop      chan struct{}
	wg        sync.WaitGroup
}

// Start starts the learner of c.Network, if it learns addresses: nil
// otherwise, and nil, with a warning logged, when the host's NFLOG cannot
// be bound (VMs then use only the addresses DHCP and their files give).
func Start(c Config) (*Learner, error) {
	n := c.Network
	if !n.LearnsAddresses() || c.Alloc == nil || c.Guard == nil {
		return nil, nil
	}
	var conn *hostnet.NFLOG
	err := c.InNS(func() (err error) {
		conn, err = hostnet.OpenNFLOG(guard.LearnGroup(n.ID), learnCopyRange)
		return err
	})
	if err != nil {
		c.Log.Warn("address learner: not running; VMs use only the addresses DHCP and their files give", "nflogGroup", guard.LearnGroup(n.ID), "err", err)
		return nil, nil
	}
	l := &Learner{n: n, alloc: c.Alloc, guard: c.Guard, inNS: c.InNS, log: c.Log, bound: c.Bound, onLease: c.OnLease,
		conn: conn, stop: make(chan struct{})}
	l.wg.Add(1)
	go l.run()
	return l, nil
}

// run reads the guard's copies until Close.
func (l *Learner) run() {
	defer l.wg.Done()
	var failLog guestlog.Limit
	for {
		pkts, err := l.conn.Receive()
		if err != nil {
			if hostnet.IsClosed(err) || isClosed(l.stop) {
				return
			}
			if ok, n := failLog.Allow(l.alloc.Now()); ok {
				l.log.Warn("address learner: reading NFLOG", "err", err, "suppressed", n)
			}
			continue // (ENOBUFS: a burst was lost; the guests retry)
		}
		for _, p := range pkts {
			if a, ok := l.arpClaim(p); ok {
				l.claim(a)
			}
		}
	}
}

// VMsKnown says that the network was told its VMs (their fixed
// addresses, which are attached): the learner may bind from now on, and
// claims what it kept until then (deferClaim).
func (l *Learner) VMsKnown() {
	if l == nil {
		return
	}
	l.known.Store(true)
	l.claimDeferred()
}

// Deferred is how many claims wait for VMsKnown.
func (l *Learner) Deferred() int {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.deferred)
}

// Close stops the learner and waits for it.
func (l *Learner) Close() {
	if l == nil {
		return
	}
	close(l.stop)
	l.conn.Close()
	l.wg.Wait()
}

// isClosed tells whether ch is closed.
func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// arpSeen is an ARP packet the guard copied: its sender's MAC and
// address, the address it asks for, and whether it is a request.
type arpSeen struct {
	mac        net.HardwareAddr
	ip, target netip.Addr
	request    bool
}

// arpClaim reads a packet the guard copied: an ARP packet that came in
// on a port of this network's bridge.
func (l *Learner) arpClaim(p hostnet.LoggedPacket) (arpSeen, bool) {
	payload := p.Payload
	if len(payload) < arpHeaderLen || binary.BigEndian.Uint32(payload) != arpEthernetIPv4Types ||
		payload[4] != 6 || payload[5] != 4 || !l.onBridge(p.InDev, p.PhysIn) {
		return arpSeen{}, false
	}
	a := arpSeen{mac: net.HardwareAddr(slices.Clone(payload[8:14])), request: binary.BigEndian.Uint16(payload[6:8]) == arpRequest}
	a.ip, _ = netip.AddrFromSlice(payload[14:18])
	a.target, _ = netip.AddrFromSlice(payload[24:28])
	return a, true
}

// claim learns the sender's address of ARP packet a and answers it for
// the gateway; before the controller told the network its VMs (VMsKnown),
// it is kept for then (deferClaim): a guest that announces its address
// once, as the network comes up, is heard.
func (l *Learner) claim(a arpSeen) {
	if !l.known.Load() {
		l.deferClaim(a)
		return
	}
	if l.learn(a.mac, a.ip) {
		l.answerGateway(a)
	}
}

// deferredClaim is a claim heard before VMsKnown, and when.
type deferredClaim struct {
	a  arpSeen
	at time.Time
}

// maxDeferred bounds the claims kept until VMsKnown (the newest win), and
// deferredFor how long one is worth claiming: the guest's next ARP
// comes anyway.
const (
	maxDeferred = 64
	deferredFor = 10 * time.Second
)

// deferClaim keeps a for claimDeferred.
func (l *Learner) deferClaim(a arpSeen) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.deferred = append(l.deferred, deferredClaim{a, time.Now()})
	if len(l.deferred) > maxDeferred {
		l.deferred = slices.Delete(l.deferred, 0, len(l.deferred)-maxDeferred)
	}
}

// claimDeferred claims, in the background, what deferClaim kept (VMsKnown
// calls it, once the network's VMs are known).
func (l *Learner) claimDeferred() {
	l.mu.Lock()
	pending := l.deferred
	l.deferred = nil
	l.mu.Unlock()
	if len(pending) == 0 {
		return
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for _, d := range pending {
			if time.Since(d.at) < deferredFor && !isClosed(l.stop) {
				l.claim(d.a)
			}
		}
	}()
}

// answerGateway answers an ARP request for the gateway whose sender
// address was just learned: the guard dropped it, and a guest that asks
// once (vmnet-helper's own tests do, and so does a VMM's first probe)
// would hear nothing. The reply is the kernel's own answer, sent for it
// from the bridge, and the kernel is given the neighbour entry it would
// have made from the request (stale: it checks it when it next uses it).
func (l *Learner) answerGateway(a arpSeen) {
	if !a.request || a.target != l.n.Gateway {
		return
	}
	err := l.inNS(func() error {
		br, err := vnl.LinkByName(l.n.Bridge())
		if err != nil {
			return err
		}
		nb := &vnl.Neigh{LinkIndex: br.Attrs().Index, Family: unix.AF_INET, State: vnl.NUD_STALE,
			IP: net.IP(a.ip.AsSlice()), HardwareAddr: a.mac}
		if err := vnl.NeighSet(nb); err != nil {
			return fmt.Errorf("the neighbour entry: %w", err)
		}
		return sendARPReply(br.Attrs().Index, br.Attrs().HardwareAddr, l.n.Gateway, a.mac, a.ip)
	})
	if err != nil {
		if ok, n := l.answerLog.Allow(l.alloc.Now()); ok {
			l.log.Warn("address learner: answering for the gateway", "mac", a.mac.String(), "ip", a.ip, "err", err, "suppressed", n)
		}
	}
}

// arpRequest and arpReply are ARP's operations (RFC 826).
const (
	arpRequest = 1
	arpReply   = 2
)

// sendARPReply sends, on link index (the bridge), "ip is at mac" to the
// host of toMAC and toIP. Its packet socket has no protocol: it sends and
// never receives.
func sendARPReply(index int, mac net.HardwareAddr, ip netip.Addr, toMAC net.HardwareAddr, toIP netip.Addr) error {
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	frame := make([]byte, 0, 42)
	frame = append(frame, toMAC...)
	frame = append(frame, mac...)
	frame = binary.BigEndian.AppendUint16(frame, unix.ETH_P_ARP)
	frame = binary.BigEndian.AppendUint32(frame, arpEthernetIPv4Types)
	frame = append(frame, 6, 4)
	frame = binary.BigEndian.AppendUint16(frame, arpReply)
	frame = append(frame, mac...)
	frame = append(frame, ip.AsSlice()...)
	frame = append(frame, toMAC...)
	frame = append(frame, toIP.AsSlice()...)
	to := &unix.SockaddrLinklayer{Ifindex: index, Protocol: rawsock.Proto(unix.ETH_P_ARP), Halen: 6}
	copy(to.Addr[:], toMAC)
	return unix.Sendto(fd, frame, 0, to)
}

// onBridge tells whether an NFLOG packet's devices are this network's
// bridge or one of its ports (with bridge netfilter, indev is the bridge
// and physin the port; without it, indev is the port).
func (l *Learner) onBridge(indev, physin uint32) bool {
	var ok bool
	l.inNS(func() error {
		br, err := vnl.LinkByName(l.n.Bridge())
		if err != nil {
			return err
		}
		if int(indev) == br.Attrs().Index {
			ok = true
			return nil
		}
		port := indev
		if physin != 0 {
			port = physin
		}
		l, err := vnl.LinkByIndex(int(port))
		ok = err == nil && l.Attrs().MasterIndex == br.Attrs().Index
		return nil
	})
	return ok
}

// learn binds ip to mac if the allocator lets it (Learn), and has the
// guard, the VMs' egress policies and the forwards follow; it tells
// whether ip is mac's now.
func (l *Learner) learn(mac net.HardwareAddr, ip netip.Addr) bool {
	if slices.Contains(l.alloc.BoundTo(mac), ip) {
		// Bound already (a copy that raced the binding): the guard
		// may lag.
		l.guard.SyncMAC(context.Background(), mac)
		return true
	}
	refuse := func(err error) {
		if ok, n := l.logLimit.Allow(l.alloc.Now()); ok {
			l.log.Info("address learner: refused", "mac", mac.String(), "ip", ip, "err", err, "suppressed", n)
		}
	}
	switch {
	case !l.known.Load():
		// Until the controller told the network its VMs (their fixed
		// addresses, which VMs are attached), an address may look free
		// that is a VM file's or an attached VM's kept lease.
		refuse(errors.New("the network's VMs are not known yet"))
		return false
	case !l.learnHeld(mac):
		refuse(fmt.Errorf("it learned an address less than %v ago", learnHold))
		return false
	case !l.allPortsGuarded():
		// A port the guard does not check (spoofCheck: false, a link the
		// user attached) may use addresses the allocator does not know.
		refuse(errors.New("a port of the bridge is not guarded"))
		return false
	}
	if _, err := l.alloc.Learn(mac, ip); err != nil {
		refuse(err)
		return false
	}
	l.learned(mac)
	if ok, n := l.logLimit.Allow(l.alloc.Now()); ok {
		l.log.Info("address learner: bound", "mac", mac.String(), "ip", ip, "suppressed", n)
	}
	l.bound(mac)
	if l.onLease != nil {
		l.onLease("address-learned", l.n.ID, mac.String(), ip)
	}
	return true
}

// learnHeld tells whether mac may learn an address now: learnHold after
// the last it learned (a refused claim holds nothing up).
func (l *Learner) learnHeld(mac net.HardwareAddr) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	t, ok := l.learnedAt[mac.String()]
	return !ok || l.alloc.Now().Sub(t) >= learnHold
}

// learned records that mac learned an address now (learnHeld).
func (l *Learner) learned(mac net.HardwareAddr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.alloc.Now()
	if l.learnedAt == nil {
		l.learnedAt = map[string]time.Time{}
	}
	for m, t := range l.learnedAt { // bounded: old entries go
		if now.Sub(t) >= learnHold {
			delete(l.learnedAt, m)
		}
	}
	l.learnedAt[mac.String()] = now
}

// allPortsGuarded tells whether the guard checks every port of the
// network's bridge.
func (l *Learner) allPortsGuarded() bool {
	var ok bool
	l.inNS(func() error {
		br, err := vnl.LinkByName(l.n.Bridge())
		if err != nil {
			return err
		}
		links, err := hostnet.BriefLinks()
		if err != nil {
			return err
		}
		guarded, err := guard.GuardedPorts(l.n.ID)
		if err != nil {
			return err
		}
		for _, l := range links {
			if l.Master == br.Attrs().Index && !guarded[uint32(l.Index)] {
				return nil
			}
		}
		ok = true
		return nil
	})
	return ok
}
