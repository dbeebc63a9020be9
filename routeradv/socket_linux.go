package routeradv

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/rtlink"
)

// socket is the server's ICMPv6 socket on one interface: bound to the
// interface's link-local address, hop limit 255 on what it sends (RFC
// 4861), in the all-routers group, receiving router solicitations only,
// each with its hop limit.
//
// It is made and used with x/sys, not through package net (as
// mdlayher/ndp's Conn is): net names an IPv6 link-local address's zone
// through a process-wide cache of the host's interfaces, which it
// refreshes, on a bind, on a send to a zone and on every read from a
// link-local sender (a guest's solicitation) at least once a minute, by
// reading every link of the host. With 10,000 VM ports that is a 20 MB
// dump and some 0.6 s of CPU each time, and a network's start did it
// three times (a controller starting 11 networks held 230 MB of them at
// once). It also resolved a name in whichever network namespace last
// refreshed the cache. Here the interface is its index, always.
type socket struct {
	f     *os.File // in Go's poller: Close ends a read
	rc    syscall.RawConn
	index int
}

// listen opens the socket on the interface of index, from its link-local
// address src. It fails while src is tentative (DAD): the kernel refuses
// to bind to it.
func listen(index int, src netip.Addr) (*socket, error) {
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.IPPROTO_ICMPV6)
	if err != nil {
		return nil, fmt.Errorf("ICMPv6 socket: %w", err)
	}
	if err := setup(fd, index, src); err != nil {
		unix.Close(fd)
		return nil, err
	}
	s := &socket{f: os.NewFile(uintptr(fd), "icmpv6"), index: index}
	if s.rc, err = s.f.SyscallConn(); err != nil {
		s.f.Close()
		return nil, err
	}
	return s, nil
}

// setup binds fd to src on the interface of index and sets what listen
// says.
func setup(fd, index int, src netip.Addr) error {
	// What is blocked is set: all but router solicitations.
	var f unix.ICMPv6Filter
	for i := range f.Data {
		f.Data[i] = ^uint32(0)
	}
	rs := uint32(ipv6.ICMPTypeRouterSolicitation)
	f.Data[rs>>5] &^= 1 << (rs & 31)
	mreq := unix.IPv6Mreq{Multiaddr: allRouters.As16(), Interface: uint32(index)}
	for _, step := range []struct {
		what string
		err  error
	}{
		{"ICMPv6 filter", unix.SetsockoptICMPv6Filter(fd, unix.SOL_ICMPV6, unix.ICMPV6_FILTER, &f)},
		{"hop limit", unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_UNICAST_HOPS, hopLimit)},
		{"multicast hop limit", unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_HOPS, hopLimit)},
		{"receiving the hop limit", unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_RECVHOPLIMIT, 1)},
		{"binding to " + src.String(), unix.Bind(fd, &unix.SockaddrInet6{Addr: src.As16(), ZoneId: uint32(index)})},
		// The interface is in all-routers only while forwarding is on.
		{"joining " + allRouters.String(), unix.SetsockoptIPv6Mreq(fd, unix.IPPROTO_IPV6, unix.IPV6_JOIN_GROUP, &mreq)},
	} {
		if step.err != nil {
			return fmt.Errorf("%s: %w", step.what, step.err)
		}
	}
	return nil
}

// hopLimit is what NDP's messages carry, and must (RFC 4861).
const hopLimit = 255

// sendTo sends the ICMPv6 message b to dst, a link-local or multicast
// address on the socket's interface, within timeout.
func (s *socket) sendTo(b []byte, dst netip.Addr, timeout time.Duration) error {
	if err := s.f.SetWriteDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	to := &unix.SockaddrInet6{Addr: dst.As16(), ZoneId: uint32(s.index)}
	var serr error
	err := s.rc.Write(func(fd uintptr) bool {
		serr = unix.Sendto(int(fd), b, 0, to)
		return serr != unix.EAGAIN
	})
	return errors.Join(err, serr)
}

// read reads the next ICMPv6 message into b: its length, its hop limit
// and who sent it (no zone). It fails with net.ErrClosed once the socket
// is closed.
func (s *socket) read(b []byte) (n, hops int, from netip.Addr, err error) {
	oob := make([]byte, unix.CmsgSpace(4))
	var oobn int
	var sa unix.Sockaddr
	var rerr error
	err = s.rc.Read(func(fd uintptr) bool {
		n, oobn, _, sa, rerr = unix.Recvmsg(int(fd), b, oob, 0)
		return rerr != unix.EAGAIN
	})
	if errors.Is(err, os.ErrClosed) {
		return 0, 0, netip.Addr{}, net.ErrClosed
	}
	if err = errors.Join(err, rerr); err != nil {
		return 0, 0, netip.Addr{}, err
	}
	var cm ipv6.ControlMessage
	if cm.Parse(oob[:oobn]) == nil {
		hops = cm.HopLimit
	}
	if sa, ok := sa.(*unix.SockaddrInet6); ok {
		from = netip.AddrFrom16(sa.Addr)
	}
	return n, hops, from, nil
}

// Close closes the socket; a read under way returns.
func (s *socket) Close() error { return s.f.Close() }

// linkLocal is the interface name's index, MAC and first link-local
// address, read by its name and of it alone: no dump of every link.
func linkLocal(name string) (index int, mac net.HardwareAddr, addr netip.Addr, err error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return 0, nil, netip.Addr{}, err
	}
	// Of the link alone (an address dump of the host walks every link).
	addrs, err := rtlink.Addrs(l.Attrs().Index, unix.AF_INET6)
	if err != nil {
		return 0, nil, netip.Addr{}, err
	}
	for _, a := range addrs {
		if ip := a.Prefix.Addr(); ip.Is6() && ip.IsLinkLocalUnicast() {
			return l.Attrs().Index, l.Attrs().HardwareAddr, ip, nil
		}
	}
	return 0, nil, netip.Addr{}, errors.New("no link-local address")
}
