package netplane

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/mdlayher/netlink"
	vnl "github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/guard"
	"github.com/vmnetctl/vmnetctl/guestlog"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/rawsock"
)

// The IPv4 learner: a VM that gives itself an address (a static address,
// vmnet-helper's clients' way, cloud-init's) is let use it once it
// announces it by ARP, if the address is free (leases.Allocator.Learn).
// The guard drops an ARP whose sender address is not bound to the port's
// MAC, as before, and copies it (a bounded number a second per port) to
// the learner through NFLOG: no such ARP ever reaches another VM, so none
// can poison their caches, and the guest's next ARP (it retries every
// second) passes once the address is bound. The learned address is a lease
// marked learned: the guard, status, DNS names and forwards follow it as
// they follow a DHCP lease, and DHCP's clients come first.

// NFLOG's protocol (linux/netfilter/nfnetlink_log.h; x/sys lacks it).
const (
	nfulnlMsgPacket    = 0
	nfulnlMsgConfig    = 1
	nfulaIfindexIndev  = 4
	nfulaIfindexPhysIn = 6
	nfulaPayload       = 9
	nfulaCfgCmd        = 1
	nfulaCfgMode       = 2
	nfulaCfgQThresh    = 5
	nfulnlCfgCmdBind   = 1
	nfulnlCopyPacket   = 2
	learnCopyRange     = 64 // an ARP packet is 28 bytes
	// learnHold is how soon a MAC that learned an address may learn
	// another: each binding costs a journal write and the guard's
	// transaction, which a guest cycling addresses would ask for at the
	// guard's rate.
	learnHold            = 30 * time.Second
	arpHeaderLen         = 28
	arpEthernetIPv4Types = 0x0001_0800
)

// startLearner4 starts the network's IPv4 learner, if it learns
// addresses.
func (nw *Network) startLearner4() error {
	if !nw.n.LearnsAddresses() || nw.alloc == nil || nw.guard == nil {
		return nil
	}
	var c *netlink.Conn
	err := nw.inNS(func() (err error) {
		c, err = netlink.Dial(unix.NETLINK_NETFILTER, nil)
		return err
	})
	if err != nil {
		return fmt.Errorf("network %q: the address learner: %w", nw.n.ID, err)
	}
	if err := bindLearnGroup(c, guard.LearnGroup(nw.n.ID)); err != nil {
		c.Close()
		nw.log.Warn("address learner: not running; VMs use only the addresses DHCP and their files give", "nflogGroup", guard.LearnGroup(nw.n.ID), "err", err)
		return nil
	}
	nw.closers = append(nw.closers, c.Close)
	nw.wg.Add(1)
	go func() {
		defer nw.wg.Done()
		var failLog guestlog.Limit
		for {
			msgs, err := c.Receive()
			if err != nil {
				if errors.Is(err, net.ErrClosed) || isClosed(nw.stop) {
					return
				}
				if ok, n := failLog.Allow(nw.alloc.Now()); ok {
					nw.log.Warn("address learner: reading NFLOG", "err", err, "suppressed", n)
				}
				continue // (ENOBUFS: a burst was lost; the guests retry)
			}
			for _, m := range msgs {
				if a, ok := nw.arpClaim(m); ok {
					nw.claim(a)
				}
			}
		}
	}()
	return nil
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

// bindLearnGroup binds c to NFLOG group, copying whole (short) packets.
func bindLearnGroup(c *netlink.Conn, group uint16) error {
	config := func(attrs func(*netlink.AttributeEncoder)) error {
		ae := netlink.NewAttributeEncoder()
		attrs(ae)
		b, err := ae.Encode()
		if err != nil {
			return err
		}
		hdr := []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0}
		binary.BigEndian.PutUint16(hdr[2:], group)
		_, err = c.Execute(netlink.Message{
			Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_ULOG<<8 | nfulnlMsgConfig), Flags: netlink.Request | netlink.Acknowledge},
			Data:   append(hdr, b...),
		})
		return err
	}
	if err := config(func(ae *netlink.AttributeEncoder) { ae.Bytes(nfulaCfgCmd, []byte{nfulnlCfgCmdBind}) }); err != nil {
		return err
	}
	mode := make([]byte, 6)
	binary.BigEndian.PutUint32(mode, learnCopyRange)
	mode[4] = nfulnlCopyPacket
	// Each packet at once: the kernel's default holds them until 100
	// are queued or a second went by, and a guest that asks for its
	// gateway once waits a second for the answer (vmnet-helper's own
	// tests wait one).
	qthresh := binary.BigEndian.AppendUint32(nil, 1)
	return config(func(ae *netlink.AttributeEncoder) {
		ae.Bytes(nfulaCfgMode, mode)
		ae.Bytes(nfulaCfgQThresh, qthresh)
	})
}

// arpSeen is an ARP packet the guard copied: its sender's MAC and
// address, the address it asks for, and whether it is a request.
type arpSeen struct {
	mac        net.HardwareAddr
	ip, target netip.Addr
	request    bool
}

// arpClaim reads an NFLOG message: an ARP packet that came in on a port
// of this network's bridge.
func (nw *Network) arpClaim(m netlink.Message) (arpSeen, bool) {
	if m.Header.Type != netlink.HeaderType(unix.NFNL_SUBSYS_ULOG<<8|nfulnlMsgPacket) || len(m.Data) < 4 {
		return arpSeen{}, false
	}
	ad, err := netlink.NewAttributeDecoder(m.Data[4:])
	if err != nil {
		return arpSeen{}, false
	}
	ad.ByteOrder = binary.BigEndian
	var payload []byte
	var indev, physin uint32
	for ad.Next() {
		switch ad.Type() {
		case nfulaPayload:
			payload = ad.Bytes()
		case nfulaIfindexIndev:
			indev = ad.Uint32()
		case nfulaIfindexPhysIn:
			physin = ad.Uint32()
		}
	}
	if ad.Err() != nil || len(payload) < arpHeaderLen || binary.BigEndian.Uint32(payload) != arpEthernetIPv4Types ||
		payload[4] != 6 || payload[5] != 4 || !nw.onBridge(indev, physin) {
		return arpSeen{}, false
	}
	a := arpSeen{mac: net.HardwareAddr(slices.Clone(payload[8:14])), request: binary.BigEndian.Uint16(payload[6:8]) == arpRequest}
	a.ip, _ = netip.AddrFromSlice(payload[14:18])
	a.target, _ = netip.AddrFromSlice(payload[24:28])
	return a, true
}

// claim learns the sender's address of ARP packet a and answers it for
// the gateway; before the controller told the network its VMs (SetVMs),
// it is kept for then (deferClaim): a guest that announces its address
// once, as the network comes up, is heard.
func (nw *Network) claim(a arpSeen) {
	if !nw.hostsKnown.Load() {
		nw.deferClaim(a)
		return
	}
	if nw.learn(a.mac, a.ip) {
		nw.answerGateway(a)
	}
}

// deferredClaim is a claim heard before SetVMs, and when.
type deferredClaim struct {
	a  arpSeen
	at time.Time
}

// maxDeferred bounds the claims kept until SetVMs (the newest win), and
// deferredFor how long one is worth claiming: the guest's next ARP
// comes anyway.
const (
	maxDeferred = 64
	deferredFor = 10 * time.Second
)

// deferClaim keeps a for claimDeferred.
func (nw *Network) deferClaim(a arpSeen) {
	nw.learnMu.Lock()
	defer nw.learnMu.Unlock()
	nw.deferred = append(nw.deferred, deferredClaim{a, time.Now()})
	if len(nw.deferred) > maxDeferred {
		nw.deferred = slices.Delete(nw.deferred, 0, len(nw.deferred)-maxDeferred)
	}
}

// claimDeferred claims, in the background, what deferClaim kept (SetVMs
// calls it, once the network's VMs are known).
func (nw *Network) claimDeferred() {
	nw.learnMu.Lock()
	pending := nw.deferred
	nw.deferred = nil
	nw.learnMu.Unlock()
	if len(pending) == 0 {
		return
	}
	nw.wg.Add(1)
	go func() {
		defer nw.wg.Done()
		for _, d := range pending {
			if time.Since(d.at) < deferredFor && !isClosed(nw.stop) {
				nw.claim(d.a)
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
func (nw *Network) answerGateway(a arpSeen) {
	if !a.request || a.target != nw.n.Gateway {
		return
	}
	err := nw.inNS(func() error {
		br, err := vnl.LinkByName(nw.n.Bridge())
		if err != nil {
			return err
		}
		nb := &vnl.Neigh{LinkIndex: br.Attrs().Index, Family: unix.AF_INET, State: vnl.NUD_STALE,
			IP: net.IP(a.ip.AsSlice()), HardwareAddr: a.mac}
		if err := vnl.NeighSet(nb); err != nil {
			return fmt.Errorf("the neighbour entry: %w", err)
		}
		return sendARPReply(br.Attrs().Index, br.Attrs().HardwareAddr, nw.n.Gateway, a.mac, a.ip)
	})
	if err != nil {
		if ok, n := nw.learnLog.Allow(nw.alloc.Now()); ok {
			nw.log.Info("address learner: answering for the gateway", "mac", a.mac.String(), "ip", a.ip, "err", err, "suppressed", n)
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
func (nw *Network) onBridge(indev, physin uint32) bool {
	var ok bool
	nw.inNS(func() error {
		br, err := vnl.LinkByName(nw.n.Bridge())
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
func (nw *Network) learn(mac net.HardwareAddr, ip netip.Addr) bool {
	if slices.Contains(nw.alloc.BoundTo(mac), ip) {
		// Bound already (a copy that raced the binding): the guard
		// may lag.
		nw.guard.SyncMAC(context.Background(), mac)
		return true
	}
	refuse := func(err error) {
		if ok, n := nw.learnLog.Allow(nw.alloc.Now()); ok {
			nw.log.Info("address learner: refused", "mac", mac.String(), "ip", ip, "err", err, "suppressed", n)
		}
	}
	switch {
	case !nw.hostsKnown.Load():
		// Until the controller told the network its VMs (their fixed
		// addresses, which VMs are attached), an address may look free
		// that is a VM file's or an attached VM's kept lease.
		refuse(errors.New("the network's VMs are not known yet"))
		return false
	case !nw.learnHeld(mac):
		refuse(fmt.Errorf("it learned an address less than %v ago", learnHold))
		return false
	case !nw.allPortsGuarded():
		// A port the guard does not check (spoofCheck: false, a link the
		// user attached) may use addresses the allocator does not know.
		refuse(errors.New("a port of the bridge is not guarded"))
		return false
	}
	if _, err := nw.alloc.Learn(mac, ip); err != nil {
		refuse(err)
		return false
	}
	nw.learned(mac)
	if ok, n := nw.learnLog.Allow(nw.alloc.Now()); ok {
		nw.log.Info("address learner: bound", "mac", mac.String(), "ip", ip, "suppressed", n)
	}
	nw.bound(mac)
	if nw.onLease != nil {
		nw.onLease("address-learned", nw.n.ID, mac.String(), ip)
	}
	return true
}

// learnHeld tells whether mac may learn an address now: learnHold after
// the last it learned (a refused claim holds nothing up).
func (nw *Network) learnHeld(mac net.HardwareAddr) bool {
	nw.learnMu.Lock()
	defer nw.learnMu.Unlock()
	t, ok := nw.learnedAt[mac.String()]
	return !ok || nw.alloc.Now().Sub(t) >= learnHold
}

// learned records that mac learned an address now (learnHeld).
func (nw *Network) learned(mac net.HardwareAddr) {
	nw.learnMu.Lock()
	defer nw.learnMu.Unlock()
	now := nw.alloc.Now()
	if nw.learnedAt == nil {
		nw.learnedAt = map[string]time.Time{}
	}
	for m, t := range nw.learnedAt { // bounded: old entries go
		if now.Sub(t) >= learnHold {
			delete(nw.learnedAt, m)
		}
	}
	nw.learnedAt[mac.String()] = now
}

// allPortsGuarded tells whether the guard checks every port of the
// network's bridge.
func (nw *Network) allPortsGuarded() bool {
	var ok bool
	nw.inNS(func() error {
		br, err := vnl.LinkByName(nw.n.Bridge())
		if err != nil {
			return err
		}
		links, err := hostnet.BriefLinks()
		if err != nil {
			return err
		}
		guarded, err := guard.GuardedPorts(nw.n.ID)
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
