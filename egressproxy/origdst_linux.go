package egressproxy

import (
	"encoding/binary"
	"net"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ip6tSOOriginalDst is linux/netfilter_ipv6/ip6_tables.h's
// IP6T_SO_ORIGINAL_DST, which x/sys/unix lacks.
const ip6tSOOriginalDst = 80

// originalDst is a redirected connection's destination before the
// redirect, from conntrack (SO_ORIGINAL_DST, IP6T_SO_ORIGINAL_DST).
func originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var ap netip.AddrPort
	var serr error
	v6 := addrPortOf(c.LocalAddr()).Addr().Is6()
	err = rc.Control(func(fd uintptr) {
		var sa [unix.SizeofSockaddrInet6]byte
		size := uint32(len(sa))
		level, opt := unix.SOL_IP, unix.SO_ORIGINAL_DST
		if v6 {
			level, opt = unix.SOL_IPV6, ip6tSOOriginalDst
		}
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, uintptr(level), uintptr(opt),
			uintptr(unsafe.Pointer(&sa[0])), uintptr(unsafe.Pointer(&size)), 0)
		if errno != 0 {
			serr = errno
			return
		}
		port := binary.BigEndian.Uint16(sa[2:4])
		if v6 {
			// (Not unmapped: an IPv4 address written as IPv6 is
			// refused as it is.)
			ap = netip.AddrPortFrom(netip.AddrFrom16([16]byte(sa[8:24])), port)
		} else {
			ap = netip.AddrPortFrom(netip.AddrFrom4([4]byte(sa[4:8])), port)
		}
	})
	if err == nil {
		err = serr
	}
	return ap, err
}
