package netplane

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/guard"
	"github.com/vmnetctl/vmnetctl/hostnet"
)

// PortSpec is what a running VM port of a network should be: a TAP on the
// network's bridge, guarded unless NoSpoofCheck, with MAC pinned (nil: the
// MAC the guard learned, or learns).
type PortSpec struct {
	Name         string
	MAC          net.HardwareAddr
	NoSpoofCheck bool
}

// EnsurePorts puts back what was taken from network n's running ports
// behind their helpers' backs: a TAP that left the bridge (the bridge was
// deleted and made again) joins it again, and a guarded port whose guard
// is gone (the guard table was deleted) is guarded again before that. A
// port that no longer exists is left to its helper, which ends and is
// restarted. The guard of a port that still has one is kept, with the MAC
// it learned. Bridged networks' macvtaps need nothing. (A port of an
// isolated network that lost its isolation is the network's drift: Check
// finds it, and Ensure isolates it again.)
func EnsurePorts(ctx context.Context, n *api.Network, ports []PortSpec) error {
	if !n.Routed() || len(ports) == 0 {
		return nil
	}
	br, err := NetworkBridge(n)
	if err != nil {
		return err
	}
	guarded, err := guard.GuardedPorts(n.ID)
	if err != nil {
		return err
	}
	// The bridge's ports, listed once (not one request a port, nor
	// every network's ports for each network); a port not among them
	// (it left the bridge, or is gone) is looked up by name.
	onBridge, err := hostnet.PortsOf(br.Attrs().Index)
	if err != nil {
		return fmt.Errorf("listing the ports of %s: %w", br.Attrs().Name, err)
	}
	links := make(map[string]hostnet.BriefLink, len(onBridge))
	for _, l := range onBridge {
		links[l.Name] = l
	}
	var errs []error
	for _, p := range ports {
		bl, ok := links[p.Name]
		if !ok {
			l, err := netlink.LinkByName(p.Name)
			if err != nil {
				continue // gone: its helper ends
			}
			bl = hostnet.BriefLink{Index: l.Attrs().Index, Master: l.Attrs().MasterIndex, Name: p.Name}
		}
		// Guarded again when its guard is gone. (A table of an older
		// vmnetctl's is migrated, its ports' guards with it, by Ensure.)
		if !p.NoSpoofCheck && !guarded[uint32(bl.Index)] {
			if err := guard.AddPort(ctx, n, p.Name, p.MAC); err != nil {
				errs = append(errs, err)
				continue // not onto the bridge unguarded
			}
		}
		if bl.Master != br.Attrs().Index {
			link, err := netlink.LinkByIndex(bl.Index)
			if err == nil {
				err = AttachPort(br.Attrs().Name, link, n.Isolation)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("network %q: %w", n.ID, err))
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%v", errs)
	}
	return nil
}

// unisolatedTaps returns the TAPs on bridge br (VM ports) that are not
// isolated, those that are up only if upOnly: on a network with isolation
// they would reach each other. (A TAP that is down may be being attached:
// AttachPort isolates it before it sets it up.)
func unisolatedTaps(br netlink.Link, upOnly bool) ([]netlink.Link, error) {
	links, err := hostnet.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	isolated, err := hostnet.RetryDump(isolatedPorts)
	if err != nil {
		return nil, fmt.Errorf("listing the ports of bridge %s: %w", br.Attrs().Name, err)
	}
	var out []netlink.Link
	for _, l := range links {
		a := l.Attrs()
		if a.MasterIndex == br.Attrs().Index && l.Type() == "tuntap" && !isolated[a.Index] && (!upOnly || a.Flags&net.FlagUp != 0) {
			out = append(out, l)
		}
	}
	return out, nil
}

// isolatedPorts tells, by interface index, which bridge ports are
// isolated (the port flag `bridge link set ... isolated on` sets).
func isolatedPorts() (map[int]bool, error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETLINK, unix.NLM_F_DUMP)
	req.AddData(nl.NewIfInfomsg(unix.AF_BRIDGE))
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWLINK)
	if err != nil {
		return nil, err
	}
	out := map[int]bool{}
	for _, m := range msgs {
		// A bridge port's message: LinkDeserialize reads its flags.
		l, err := netlink.LinkDeserialize(&unix.NlMsghdr{Type: unix.RTM_NEWLINK}, m)
		if err != nil {
			return nil, err
		}
		if pi := l.Attrs().Protinfo; pi != nil {
			out[l.Attrs().Index] = pi.Isolated
		}
	}
	return out, nil
}

// isolateTaps isolates every TAP on network n's bridge br that is not,
// if n has isolation (Ensure: the repair of a port whose flag was taken).
func isolateTaps(n *api.Network, br netlink.Link) error {
	isolating.set(br.Attrs().Name, n.Isolation)
	if !n.Isolation {
		return nil
	}
	taps, err := unisolatedTaps(br, false)
	if err != nil {
		return fmt.Errorf("network %q: %w", n.ID, err)
	}
	for _, l := range taps {
		if err := netlink.LinkSetIsolated(l, true); err != nil && !hostnet.NotFound(err) {
			return fmt.Errorf("network %q: isolating %s: %w", n.ID, l.Attrs().Name, err)
		}
	}
	return nil
}

// checkIsolation is Check's part for the ports of n's bridge br: with
// isolation, every TAP on it that is up must be isolated.
func checkIsolation(n *api.Network, br netlink.Link) []error {
	if !n.Isolation {
		return nil
	}
	taps, err := unisolatedTaps(br, true)
	if err != nil {
		return []error{fmt.Errorf("network %q: %w", n.ID, err)}
	}
	var errs []error
	for _, l := range taps {
		errs = append(errs, fmt.Errorf("network %q: port %s of bridge %s is not isolated", n.ID, l.Attrs().Name, br.Attrs().Name))
	}
	return errs
}

// WatchChanges reports, on the returned channel, changes that the
// controller should look at, as they happen:
//   - links: a bridge or a VM's TAP deleted, a TAP that left its bridge or
//     is a port that is not isolated, a bridge set down;
//   - addresses: an IPv4 address of a vmnetctl bridge added or removed, or
//     an IPv6 one removed;
//   - nftables: a vmnetctl table or chain deleted (nft delete table, nft
//     flush ruleset), and a notification lost because too many came at once;
//   - services: a network's DHCP or DNS listener that stopped on its own
//     (Network.Health).
//
// A notice lost (a socket that a burst of them overflowed) is reported as
// a change, and the watch goes on (readNotices). Sends do not block: a
// change that comes while one is pending is folded into it. The watch
// ends with ctx. Anything else (a rule deleted, a set emptied) waits for
// the controller's periodic resync, which skips re-reading the ports
// while the watch counts no notice of theirs (Watch.Notices).
func WatchChanges(ctx context.Context) (*Watch, error) {
	ctx, cancel := context.WithCancel(ctx)
	out := make(chan struct{}, 1)
	w := &Watch{C: out}
	notify := func() {
		select {
		case out <- struct{}{}:
		default:
		}
	}
	// Sockets of the watch's own, in this thread's namespace, read as
	// they are (readNotices): vishvananda/netlink's subscribers end at
	// their socket's first error, its ENOBUFS after a burst included,
	// and watched nothing more.
	var socks []*nl.NetlinkSocket
	fail := func(what string, err error) (*Watch, error) {
		cancel()
		for _, s := range socks {
			s.Close()
		}
		return nil, fmt.Errorf("watching %s: %w", what, err)
	}
	buf := watchBuffer
	for _, g := range []struct {
		what     string
		protocol int
		groups   []uint
	}{
		{"links", unix.NETLINK_ROUTE, []uint{unix.RTNLGRP_LINK}},
		{"addresses", unix.NETLINK_ROUTE, []uint{unix.RTNLGRP_IPV4_IFADDR, unix.RTNLGRP_IPV6_IFADDR}},
		{"nftables", unix.NETLINK_NETFILTER, []uint{unix.NFNLGRP_NFTABLES}},
	} {
		s, err := nl.Subscribe(g.protocol, g.groups...)
		if err != nil {
			return fail(g.what, err)
		}
		socks = append(socks, s)
		// Past net.core.rmem_max where CAP_NET_ADMIN allows it (the
		// kernel doubles it), else what the limit allows.
		if s.SetReceiveBufferSize(buf, true) != nil {
			s.SetReceiveBufferSize(buf, false)
		}
	}
	links, addrs, tables := socks[0], socks[1], socks[2]
	// Names of links by index, in this namespace (whatever thread asks).
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fail("links", err)
	}
	failed := make(chan struct{}, 1)
	services.add(failed)
	var readers sync.WaitGroup
	readers.Add(3)
	go func() {
		<-ctx.Done()
		cancel()
		w.deaf.Store(true)
		for _, s := range socks {
			s.Close() // ends readNotices' Receive
		}
		readers.Wait()
		h.Close()
		services.remove(failed)
	}()
	nameOf := func(index int) string {
		if l, err := h.LinkByIndex(index); err == nil {
			return l.Attrs().Name
		}
		return ""
	}
	lost := func(ended bool) {
		w.lost(ended)
		notify()
	}
	go func() {
		defer readers.Done()
		readNotices(ctx, links, func(m syscall.NetlinkMessage) {
			u, ok := linkUpdate(m)
			if !ok || portNotice(u, nameOf) {
				w.notices.Add(1)
			}
			if ok && linkChanged(u, nameOf) {
				notify()
			}
		}, lost)
	}()
	go func() {
		defer readers.Done()
		readNotices(ctx, addrs, func(m syscall.NetlinkMessage) {
			if addrChanged(h, m) {
				notify()
			}
		}, lost)
	}()
	go func() {
		defer readers.Done()
		readNotices(ctx, tables, func(m syscall.NetlinkMessage) {
			if ourTables(m) {
				w.notices.Add(1)
			}
			if tableDeleted(m) {
				notify()
			}
		}, lost)
	}()
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-failed:
				notify()
			}
		}
	}()
	return w, nil
}

// lost counts notices lost (ended: the socket closed too).
func (w *Watch) lost(ended bool) {
	w.notices.Add(1)
	if ended {
		w.deaf.Store(true)
	}
}

// watchBuffer is the receive buffer the watch asks for each of its
// sockets: an `up` of a fleet makes several link notices a TAP, and a
// socket that overflows loses them (reported as a change all the same).
var watchBuffer = 4 << 20

// readNotices hands each message the kernel sends to s to handle, until
// ctx ends (and s is closed). A burst that overflowed the socket (ENOBUFS:
// notices were lost) is reported (lost), and again once the reader has
// emptied the queue: until then the kernel drops every notice without a
// word (the socket stays congested), so only a pass that begins after
// that sees all of what was lost. Any other error is reported (lost,
// ended), s closed and read no more: the resync is left.
func readNotices(ctx context.Context, s *nl.NetlinkSocket, handle func(syscall.NetlinkMessage), lost func(ended bool)) {
	congested := false
	for {
		msgs, from, err := s.Receive()
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, unix.ENOBUFS):
			lost(false)
			congested = true
			continue
		case err != nil:
			lost(true)
			s.Close()
			return
		case from.Pid == nl.PidKernel:
			for _, m := range msgs {
				handle(m)
			}
		}
		if congested && !readable(s.GetFd()) {
			// The read that emptied the queue ended the congestion.
			lost(false)
			congested = false
		}
	}
}

// readable tells whether a read of fd would find something now.
func readable(fd int) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(p, 0)
	return err != nil || n > 0
}

// linkUpdate is the link notice m, as vishvananda/netlink's subscriber
// makes it; ok is false for any other message.
func linkUpdate(m syscall.NetlinkMessage) (u netlink.LinkUpdate, ok bool) {
	if (m.Header.Type != unix.RTM_NEWLINK && m.Header.Type != unix.RTM_DELLINK) || len(m.Data) < unix.SizeofIfInfomsg {
		return u, false
	}
	hdr := unix.NlMsghdr(m.Header)
	link, err := netlink.LinkDeserialize(&hdr, m.Data)
	if err != nil {
		return u, false
	}
	return netlink.LinkUpdate{IfInfomsg: *nl.DeserializeIfInfomsg(m.Data), Header: hdr, Link: link}, true
}

// linkChanged tells whether a link's notice may be drift a repair pass
// mends: a bridge of vmnetctl's deleted or down, a TAP off its bridge.
// A TAP's notices come by the thousand in a fleet (made, attached, up, its
// bridge port's state, IPv6 on it), and each repair pass reads every port:
// only a TAP that is up and off its bridge, or not isolated on a bridge
// whose network isolates its ports (nameOf names the master by index),
// has drifted. A new TAP is off its bridge, or not yet isolated, only
// while it is down (joinBridge sets it up last).
func linkChanged(u netlink.LinkUpdate, nameOf func(index int) string) bool {
	a := u.Link.Attrs()
	bridge, tap := strings.HasPrefix(a.Name, api.BridgePrefix), strings.HasPrefix(a.Name, api.TapPrefix)
	// A WireGuard device is a bridge's kin here: deleted or down, repair.
	bridge = bridge || strings.HasPrefix(a.Name, api.WireGuardPrefix)
	switch {
	case !bridge && !tap:
		return false
	case u.Header.Type == unix.RTM_DELLINK:
		// A TAP goes with its helper (a VM detached, or its helper
		// ended, which the controller sees anyway); a helper whose TAP
		// was deleted under it ends too.
		return bridge
	case tap && a.MasterIndex == 0:
		return a.Flags&net.FlagUp != 0
	case tap:
		// A bridge port's notice (family AF_BRIDGE) carries its flags.
		// A port is isolated once it joins, before it is up (joinBridge):
		// one down carries nothing yet.
		return a.Flags&net.FlagUp != 0 && a.Protinfo != nil && !a.Protinfo.Isolated && !isolating.none() && isolating.on(nameOf(a.MasterIndex))
	default:
		return a.Flags&net.FlagUp == 0
	}
}

// portNotice tells whether a link's notice may concern a network's VM
// port (Watch.Notices): that of a link with one of vmnetctl's names, or of
// a port of a vmnetctl bridge (or of a bridge that nameOf cannot name any
// more), whatever its name: a TAP renamed on its bridge is still a port,
// and its leaving the bridge is a notice of the bridge's. Somebody else's
// links and their bridges' ports (a container's veth) are not.
func portNotice(u netlink.LinkUpdate, nameOf func(index int) string) bool {
	a := u.Link.Attrs()
	if api.OwnInterface(a.Name) {
		return true
	}
	if a.MasterIndex == 0 {
		return false
	}
	master := nameOf(a.MasterIndex)
	return master == "" || api.OwnInterface(master)
}

// ourTables tells whether an nftables notice may concern a vmnetctl
// table (Watch.Notices): any that names one, or names no table, but the
// generation's notice, which ends every commit of anyone's. (The table's
// name is attribute 1 of every other kind: NFTA_TABLE_NAME,
// NFTA_CHAIN_TABLE, NFTA_RULE_TABLE, NFTA_SET_TABLE,
// NFTA_SET_ELEM_LIST_TABLE, NFTA_OBJ_TABLE, NFTA_FLOWTABLE_TABLE.)
func ourTables(m syscall.NetlinkMessage) bool {
	if m.Header.Type == unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWGEN {
		return false
	}
	name := nfAttr(m.Data, unix.NFTA_TABLE_NAME)
	return name == "" || strings.HasPrefix(name, hostnet.TablePrefix)
}

// isolating is the bridges whose networks isolate their ports (Ensure
// records them): the watch reports a port of theirs that is not isolated.
var isolating bridgeSet

// bridgeSet is a set of bridge names, safe for concurrent use.
type bridgeSet struct {
	mu    sync.Mutex
	names map[string]bool
}

func (s *bridgeSet) set(name string, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.names == nil {
		s.names = map[string]bool{}
	}
	if on {
		s.names[name] = true
	} else {
		delete(s.names, name)
	}
}

func (s *bridgeSet) on(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.names[name]
}

func (s *bridgeSet) none() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.names) == 0
}

// addrChanged tells whether the address notice m is a change Check may
// find wrong: any IPv4 address of a vmnetctl bridge, or an IPv6 one
// removed (IPv6 addresses come and change state on their own: link-local,
// DAD). A deleted bridge's addresses are the link watch's.
func addrChanged(h *netlink.Handle, m syscall.NetlinkMessage) bool {
	added := m.Header.Type == unix.RTM_NEWADDR
	if !added && m.Header.Type != unix.RTM_DELADDR || len(m.Data) < unix.SizeofIfAddrmsg {
		return false
	}
	// ifaddrmsg: the family first, the interface index at 4.
	if m.Data[0] != unix.AF_INET && added {
		return false
	}
	l, err := h.LinkByIndex(int(binary.NativeEndian.Uint32(m.Data[4:8])))
	return err == nil && strings.HasPrefix(l.Attrs().Name, api.BridgePrefix)
}

// tableDeleted tells whether m reports a vmnetctl table or chain deleted.
func tableDeleted(m syscall.NetlinkMessage) bool {
	switch m.Header.Type {
	case unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_DELTABLE:
		return strings.HasPrefix(nfAttr(m.Data, unix.NFTA_TABLE_NAME), hostnet.TablePrefix)
	case unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_DELCHAIN:
		return strings.HasPrefix(nfAttr(m.Data, unix.NFTA_CHAIN_TABLE), hostnet.TablePrefix)
	}
	return false
}

// nfAttr returns the string attribute typ of an nfnetlink message's data
// (its nfgenmsg header, then attributes), "" when it has none.
func nfAttr(data []byte, typ uint16) string {
	const nfgenmsgLen = 4
	if len(data) < nfgenmsgLen {
		return ""
	}
	for t, v := range hostnet.Attrs(data[nfgenmsgLen:]) {
		if t&^(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER) == typ {
			return strings.TrimRight(string(v), "\x00")
		}
	}
	return ""
}

// services are the watchers (WatchChanges) told when a network's service
// stops on its own (Network.fail).
var services watchers

type watchers struct {
	mu sync.Mutex
	m  map[chan struct{}]bool
}

func (w *watchers) add(ch chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.m == nil {
		w.m = map[chan struct{}]bool{}
	}
	w.m[ch] = true
}

func (w *watchers) remove(ch chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.m, ch)
}

// notify tells every watcher, without blocking.
func (w *watchers) notify() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for ch := range w.m {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}
