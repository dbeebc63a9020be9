package testutil

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

// The neighbour discovery frames a guest writes, for the IPv6 learner's
// and the guard's tests.

// AllNodesMAC is the Ethernet address of the IPv6 all-nodes group.
var AllNodesMAC = net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}

// ND6Frame is an Ethernet frame with an ICMPv6 ND message of type typ
// (flags: the first byte after the checksum; target; options), its checksum
// computed by x/net/icmp.
func ND6Frame(t testing.TB, srcMAC, dstMAC net.HardwareAddr, src, dst netip.Addr, hopLimit byte, typ ipv6.ICMPType, flags byte, target netip.Addr, opts ...[]byte) []byte {
	t.Helper()
	body := make([]byte, 20)
	body[0] = flags
	copy(body[4:], target.AsSlice())
	for _, o := range opts {
		body = append(body, o...)
	}
	m := icmp.Message{Type: typ, Body: &icmp.RawBody{Data: body}}
	msg, err := m.Marshal(icmp.IPv6PseudoHeader(src.AsSlice(), dst.AsSlice()))
	if err != nil {
		t.Fatal(err)
	}
	f := make([]byte, 14+ipv6.HeaderLen, 14+ipv6.HeaderLen+len(msg))
	copy(f, dstMAC)
	copy(f[6:], srcMAC)
	binary.BigEndian.PutUint16(f[12:], unix.ETH_P_IPV6)
	ip := f[14:]
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], uint16(len(msg)))
	ip[6], ip[7] = unix.IPPROTO_ICMPV6, hopLimit
	copy(ip[8:], src.AsSlice())
	copy(ip[24:], dst.AsSlice())
	return append(f, msg...)
}

// ND6LLA is a link-layer address option (1: source, 2: target).
func ND6LLA(typ byte, mac net.HardwareAddr) []byte { return append([]byte{typ, 1}, mac...) }

// SolicitedNode is the solicited-node group of a and its Ethernet address.
func SolicitedNode(a netip.Addr) (netip.Addr, net.HardwareAddr) {
	b := a.As16()
	g := netip.AddrFrom16([16]byte{0xff, 0x02, 11: 0x01, 12: 0xff, 13: b[13], 14: b[14], 15: b[15]})
	return g, net.HardwareAddr{0x33, 0x33, 0xff, b[13], b[14], b[15]}
}

// DADNS is a duplicate address detection solicitation for target from mac.
func DADNS(t testing.TB, mac net.HardwareAddr, target netip.Addr, opts ...[]byte) []byte {
	g, gm := SolicitedNode(target)
	return ND6Frame(t, mac, gm, netip.IPv6Unspecified(), g, 255, ipv6.ICMPTypeNeighborSolicitation, 0, target, opts...)
}

// RawSender writes Ethernet frames on eth0 of a VM namespace, as a guest
// that writes raw frames does.
type RawSender struct {
	fd    int
	index int
}

// NewRawSender opens a RawSender in namespace v; it closes with the test.
func NewRawSender(t *testing.T, v *NS) *RawSender {
	t.Helper()
	s := &RawSender{fd: -1}
	if err := v.Do(func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		// Protocol 0: it sends, and receives nothing.
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		s.fd, s.index = fd, ifi.Index
		return err
	}); err != nil {
		t.Fatalf("in %s: %v", v, err)
	}
	t.Cleanup(func() { unix.Close(s.fd) })
	return s
}

// Send writes frames, each to its own destination address.
func (s *RawSender) Send(t *testing.T, frames ...[]byte) {
	t.Helper()
	for _, f := range frames {
		// ETH_P_IPV6 (0x86dd) in network byte order.
		to := &unix.SockaddrLinklayer{Ifindex: s.index, Protocol: 0xdd86, Halen: 6}
		copy(to.Addr[:], f[:6])
		if err := unix.Sendto(s.fd, f, 0, to); err != nil {
			t.Fatalf("sending a frame: %v", err)
		}
	}
}
