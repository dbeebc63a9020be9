package rtlink

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
)

// Addr is an address of a link as rtnetlink describes it.
type Addr struct {
	// Prefix is the address and its prefix length; Peer, for a
	// point-to-point one, the other end's (IPv4's IFA_ADDRESS where it
	// differs from IFA_LOCAL), its length the prefix's.
	Prefix, Peer netip.Prefix
	Broadcast    netip.Addr // IPv4's broadcast address, if it has one
	Flags        uint32     // IFA_F_*
	Scope        uint8
	Label        string // IPv4's label (the link's name, or name:alias)
	// PreferredLft and ValidLft are its lifetimes in seconds
	// (0xffffffff: forever).
	PreferredLft, ValidLft uint32
}

// Addrs reads the addresses of family (unix.AF_INET or AF_INET6) on the
// link of interface index (none if there is no such link), in a dump the
// kernel filters by that index (NETLINK_GET_STRICT_CHK, set on c's socket
// at the first call, for its later requests too: the link requests of
// this package pass the kernel's strict checks as well): a plain
// address dump (netlink.AddrList's) makes the kernel walk every link of
// the host, which beside 10,000 VM ports was a third of an idle
// controller's netlink time. A kernel without strict checks sends every
// address, and those of other links are left out here.
func (c *Conn) Addrs(index int, family uint8) ([]Addr, error) {
	if !c.strict {
		// (Refused by kernels before 4.20: they dump every address.)
		unix.SetsockoptInt(c.fd, unix.SOL_NETLINK, unix.NETLINK_GET_STRICT_CHK, 1)
		c.strict = true
	}
	var ifa [unix.SizeofIfAddrmsg]byte
	ifa[0] = family
	binary.NativeEndian.PutUint32(ifa[4:], uint32(index))
	for range dumpTries {
		var out []Addr
		interrupted, err := c.ask(unix.RTM_GETADDR, unix.NLM_F_DUMP, unix.RTM_NEWADDR, index, ifa[:], func(m []byte) {
			if a, ok := parseAddr(m); ok && m[0] == family && int(binary.NativeEndian.Uint32(m[4:8])) == index {
				out = append(out, a)
			}
		})
		switch {
		case errors.Is(err, ErrGone):
			return nil, nil // (as netlink.AddrList: no link, no address)
		case err != nil:
			return nil, err
		case !interrupted:
			return out, nil
		}
	}
	return nil, fmt.Errorf("link %d: the address dump was interrupted %d times", index, dumpTries)
}

// Addrs is Conn.Addrs on a Conn of its own, in this thread's namespace.
func Addrs(index int, family uint8) ([]Addr, error) {
	c, err := Open()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.Addrs(index, family)
}

// dumpTries bounds the tries of an address dump that the kernel
// interrupted (NLM_F_DUMP_INTR: the addresses changed while it ran, and
// some may be missing from it).
const dumpTries = 10

// parseAddr reads the body m of an address's message (ifaddrmsg, then its
// attributes); ok is false for one too short, or without an address.
// IPv4 sends its address as IFA_LOCAL and IFA_ADDRESS, the latter the
// peer's where they differ; IPv6 as IFA_ADDRESS alone, or with IFA_LOCAL
// for a point-to-point one.
func parseAddr(m []byte) (a Addr, ok bool) {
	if len(m) < unix.SizeofIfAddrmsg {
		return Addr{}, false
	}
	family, bits := m[0], int(m[1])
	a.Flags, a.Scope = uint32(m[2]), m[3]
	var local, address netip.Addr
	for typ, v := range attrs(m[unix.SizeofIfAddrmsg:]) {
		switch typ {
		case unix.IFA_ADDRESS:
			address, _ = netip.AddrFromSlice(v)
		case unix.IFA_LOCAL:
			local, _ = netip.AddrFromSlice(v)
		case unix.IFA_BROADCAST:
			a.Broadcast, _ = netip.AddrFromSlice(v)
		case unix.IFA_LABEL:
			a.Label = unix.ByteSliceToString(v)
		case unix.IFA_FLAGS:
			if len(v) >= 4 {
				a.Flags = binary.NativeEndian.Uint32(v)
			}
		case unix.IFA_CACHEINFO:
			if len(v) >= 8 {
				a.PreferredLft, a.ValidLft = binary.NativeEndian.Uint32(v), binary.NativeEndian.Uint32(v[4:])
			}
		}
	}
	switch {
	case !local.IsValid():
		a.Prefix = netip.PrefixFrom(address, bits)
	case family == unix.AF_INET && address == local:
		a.Prefix = netip.PrefixFrom(address, bits)
	default:
		// The local end is a host address, the prefix the peer's.
		a.Prefix = netip.PrefixFrom(local, local.BitLen())
		if address.IsValid() {
			a.Peer = netip.PrefixFrom(address, bits)
		}
	}
	return a, a.Prefix.IsValid()
}
