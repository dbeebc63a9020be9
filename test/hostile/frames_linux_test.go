package hostile

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// attacker is a hostile VM with no stack at all: it writes raw Ethernet
// frames on its own helper socket, as any guest can, and reads what the
// helper sends it.
type attacker struct {
	t   *testing.T
	mac net.HardwareAddr
	// hostname is the DHCP host name its requests send, if any.
	hostname string
	conn     *net.UnixConn
	helper   *net.UnixAddr
}

func newAttacker(t *testing.T, mac net.HardwareAddr, helperPath, clientPath string) *attacker {
	t.Helper()
	os.Remove(clientPath)
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: clientPath, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &attacker{t: t, mac: mac, conn: conn, helper: &net.UnixAddr{Name: helperPath, Net: "unixgram"}}
}

// send writes one frame.
func (a *attacker) send(frame []byte) {
	a.t.Helper()
	if _, err := a.conn.WriteToUnix(frame, a.helper); err != nil {
		a.t.Fatalf("attacker: writing a frame: %v", err)
	}
}

// dhcp sends a DHCP message from src (Ethernet and nothing else: chaddr is
// the message's) and returns the reply for its transaction, or nil if none
// comes within a second.
func (a *attacker) dhcp(src net.HardwareAddr, m *dhcpv4.DHCPv4) *dhcpv4.DHCPv4 {
	a.t.Helper()
	a.send(ether(broadcastMAC, src, etherIPv4, ipv4UDP(netip.IPv4Unspecified(), netip.MustParseAddr("255.255.255.255"), 68, 67, m.ToBytes())))
	deadline := time.Now().Add(time.Second)
	buf := make([]byte, 65536)
	for {
		f := a.read(buf, deadline)
		if f == nil {
			return nil
		}
		if r := parseDHCPReply(f); r != nil && r.TransactionID == m.TransactionID {
			return r
		}
	}
}

// read returns the next frame the attacker gets, in buf, or nil if none
// comes before until.
func (a *attacker) read(buf []byte, until time.Time) []byte {
	a.t.Helper()
	a.conn.SetReadDeadline(until)
	n, err := a.conn.Read(buf)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return nil
	}
	if err != nil {
		a.t.Fatalf("attacker: reading: %v", err)
	}
	return buf[:n]
}

// lease gets an address for the attacker's own MAC the proper way.
func (a *attacker) lease() netip.Addr {
	a.t.Helper()
	// Retried as a DHCP client does: a port that has just come up may
	// not forward the first frames yet.
	var off *dhcpv4.DHCPv4
	for range 5 {
		disc, _ := dhcpv4.NewDiscovery(a.mac)
		if off = a.dhcp(a.mac, disc); off != nil {
			break
		}
	}
	if off == nil || off.MessageType() != dhcpv4.MessageTypeOffer {
		a.t.Fatalf("attacker's own DISCOVER: %v", off)
	}
	var mods []dhcpv4.Modifier
	if a.hostname != "" {
		mods = append(mods, dhcpv4.WithOption(dhcpv4.OptHostName(a.hostname)))
	}
	req, _ := dhcpv4.NewRequestFromOffer(off, mods...)
	var ack *dhcpv4.DHCPv4
	for range 5 { // (after its own floods, past the server's rate limit)
		if ack = a.dhcp(a.mac, req); ack != nil {
			break
		}
	}
	if ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck {
		a.t.Fatalf("attacker's own REQUEST: %v", ack)
	}
	ip, _ := netip.AddrFromSlice(ack.YourIPAddr.To4())
	return ip
}

var broadcastMAC = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

const (
	etherIPv4 = 0x0800
	etherARP  = 0x0806
	etherIPv6 = 0x86dd
	etherVLAN = 0x8100
)

func ether(dst, src net.HardwareAddr, typ uint16, payload []byte) []byte {
	f := make([]byte, 14, 14+len(payload))
	copy(f, dst)
	copy(f[6:], src)
	binary.BigEndian.PutUint16(f[12:], typ)
	return append(f, payload...)
}

// arp is an ARP message: op 1 request, 2 reply.
func arp(op uint16, sha net.HardwareAddr, spa netip.Addr, tha net.HardwareAddr, tpa netip.Addr) []byte {
	p := make([]byte, 28)
	binary.BigEndian.PutUint16(p[0:], 1)      // Ethernet
	binary.BigEndian.PutUint16(p[2:], 0x0800) // IPv4
	p[4], p[5] = 6, 4
	binary.BigEndian.PutUint16(p[6:], op)
	copy(p[8:], sha)
	copy(p[14:], spa.AsSlice())
	copy(p[18:], tha)
	copy(p[24:], tpa.AsSlice())
	return p
}

func checksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return ^uint16(s)
}

func ipv4(src, dst netip.Addr, proto byte, payload []byte) []byte {
	h := make([]byte, 20, 20+len(payload))
	h[0] = 0x45
	binary.BigEndian.PutUint16(h[2:], uint16(20+len(payload)))
	h[8], h[9] = 64, proto
	copy(h[12:], src.AsSlice())
	copy(h[16:], dst.AsSlice())
	binary.BigEndian.PutUint16(h[10:], checksum(h))
	return append(h, payload...)
}

func ipv4UDP(src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	u := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(u[0:], sport)
	binary.BigEndian.PutUint16(u[2:], dport)
	binary.BigEndian.PutUint16(u[4:], uint16(8+len(payload)))
	return ipv4(src, dst, 17, append(u, payload...))
}

// tcpRun is n frames of one TCP flow from src to dst, each with 1000
// bytes, in sequence, IPv4 IDs counting up: what the relay of a VM without
// offloads merges into one packet when a batch brings them together
// (relay/coalesce.go). The flow's segments first to first+n-1; each
// payload byte is fill, or counts up if fill is 0.
func tcpRun(dstMAC, srcMAC net.HardwareAddr, src, dst netip.Addr, first, n int, fill byte) [][]byte {
	var run [][]byte
	for i := first; i < first+n; i++ {
		tcp := make([]byte, 20, 20+1000)
		binary.BigEndian.PutUint16(tcp[0:], 4000)
		binary.BigEndian.PutUint16(tcp[2:], 5000)
		binary.BigEndian.PutUint32(tcp[4:], uint32(1000+i*1000))
		binary.BigEndian.PutUint32(tcp[8:], 1)
		tcp[12], tcp[13] = 5<<4, 0x10 // ACK
		binary.BigEndian.PutUint16(tcp[14:], 512)
		for j := range 1000 {
			if fill != 0 {
				tcp = append(tcp, fill)
			} else {
				tcp = append(tcp, byte(i+j))
			}
		}
		pseudo := append(append(append([]byte{}, src.AsSlice()...), dst.AsSlice()...), 0, 6, byte(len(tcp)>>8), byte(len(tcp)))
		binary.BigEndian.PutUint16(tcp[16:], checksum(append(pseudo, tcp...)))
		ip := ipv4(src, dst, 6, tcp)
		binary.BigEndian.PutUint16(ip[4:], uint16(7+i))
		ip[10], ip[11] = 0, 0
		binary.BigEndian.PutUint16(ip[10:], checksum(ip[:20]))
		run = append(run, ether(dstMAC, srcMAC, etherIPv4, ip))
	}
	return run
}

// icmpEcho is an ICMP echo request.
func icmpEcho(src, dst netip.Addr) []byte {
	m := []byte{8, 0, 0, 0, 0x12, 0x34, 0, 1, 'h', 'i'}
	binary.BigEndian.PutUint16(m[2:], checksum(m))
	return ipv4(src, dst, 1, m)
}

// routerAdvert is an IPv6 router advertisement from a link-local address
// to all nodes (its checksum is not computed: the guard drops it by type).
func routerAdvert() []byte {
	icmp := []byte{134, 0, 0, 0, 64, 0, 0x07, 0x08, 0, 0, 0, 0, 0, 0, 0, 0}
	h := make([]byte, 40, 40+len(icmp))
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:], uint16(len(icmp)))
	h[6], h[7] = 58, 255
	copy(h[8:], netip.MustParseAddr("fe80::bad").AsSlice())
	copy(h[24:], netip.MustParseAddr("ff02::1").AsSlice())
	return append(h, icmp...)
}

// parseDHCPReply returns the DHCP message a frame carries to port 68.
func parseDHCPReply(f []byte) *dhcpv4.DHCPv4 {
	if len(f) < 14+20+8 || binary.BigEndian.Uint16(f[12:]) != etherIPv4 {
		return nil
	}
	ip := f[14:]
	ihl := int(ip[0]&0x0f) * 4
	if ip[9] != 17 || len(ip) < ihl+8 || binary.BigEndian.Uint16(ip[ihl+2:]) != 68 {
		return nil
	}
	m, err := dhcpv4.FromBytes(ip[ihl+8:])
	if err != nil {
		return nil
	}
	return m
}

// randomMAC is a locally administered unicast MAC, different for each i.
func randomMAC(i int) net.HardwareAddr {
	return net.HardwareAddr{0x02, 0xba, 0xd0, byte(i >> 16), byte(i >> 8), byte(i)}
}

func mustMAC(s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(fmt.Sprintf("%s: %v", s, err))
	}
	return m
}

// tapWriter writes frames into a persistent TAP, as a VMM that opens the
// TAP itself (firecracker, cloud-hypervisor, qemu -netdev tap) does.
func tapWriter(t *testing.T, ns *testutil.NS, name string) func([]byte) {
	t.Helper()
	var fd int
	err := ns.Do(func() error {
		var err error
		fd, err = testutil.OpenTAP(name)
		return err
	})
	if err != nil {
		t.Fatalf("opening TAP %s: %v", name, err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return func(f []byte) {
		t.Helper()
		if _, err := unix.Write(fd, f); err != nil {
			t.Fatalf("writing to TAP %s: %v", name, err)
		}
	}
}

// capture records every frame that arrives on an interface of a namespace
// (an AF_PACKET socket bound to it), until the test ends.
type capture struct {
	mu     sync.Mutex
	frames [][]byte
}

func startCapture(t *testing.T, ns *testutil.NS, ifname string) *capture {
	t.Helper()
	var fd int
	err := ns.Do(func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		proto := int(htons(unix.ETH_P_ALL))
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto); err != nil {
			return err
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index}); err != nil {
			unix.Close(fd)
			return err
		}
		// Reads wake up now and then, so that the reader sees the end.
		return unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 100_000})
	})
	if err != nil {
		t.Fatalf("capturing on %s: %v", ifname, err)
	}
	c := &capture{}
	var wg sync.WaitGroup
	var done atomic.Bool
	wg.Go(func() {
		buf := make([]byte, 65536)
		for !done.Load() {
			n, from, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				continue
			}
			if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
				continue // the namespace's own
			}
			c.mu.Lock()
			c.frames = append(c.frames, slices.Clone(buf[:n]))
			c.mu.Unlock()
		}
	})
	t.Cleanup(func() { done.Store(true); wg.Wait(); unix.Close(fd) })
	return c
}

// count returns how many captured frames match.
func (c *capture) count(match func(f []byte) bool) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, f := range c.frames {
		if match(f) {
			n++
		}
	}
	return n
}

// seen returns how many captured frames begin with frame (a frame may
// arrive padded).
func (c *capture) seen(frame []byte) int {
	return c.count(func(f []byte) bool { return bytes.HasPrefix(f, frame) })
}

// containing returns how many captured frames contain b.
func (c *capture) containing(b []byte) int {
	return c.count(func(f []byte) bool { return bytes.Contains(f, b) })
}

// seenFrom returns how many captured frames came from mac.
func (c *capture) seenFrom(mac net.HardwareAddr) int {
	return c.count(func(f []byte) bool { return len(f) >= 12 && bytes.Equal(f[6:12], mac) })
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// query asks the DNS proxy at gw (whose MAC is gwMAC) for name from the
// attacker's own address ip, as a guest with a stack would: it answers
// the host's ARP requests for ip meanwhile. It returns the answer, or nil
// if none comes within two seconds.
func (a *attacker) query(gwMAC net.HardwareAddr, ip, gw netip.Addr, name string) *dns.Msg {
	a.t.Helper()
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), dns.TypeA)
	wire, err := q.Pack()
	if err != nil {
		a.t.Fatal(err)
	}
	const sport = 40053
	deadline := time.Now().Add(2 * time.Second)
	buf := make([]byte, 65536)
	for next := time.Now(); ; {
		if now := time.Now(); !now.Before(next) {
			a.send(ether(gwMAC, a.mac, etherIPv4, ipv4UDP(ip, gw, sport, 53, wire)))
			next = now.Add(500 * time.Millisecond)
		}
		wake := next
		if deadline.Before(wake) {
			wake = deadline
		}
		f := a.read(buf, wake)
		if f == nil {
			if time.Now().Before(deadline) {
				continue
			}
			return nil
		}
		if a.answerARP(f, ip) {
			continue
		}
		if p := udpPayload(f, 53, sport); p != nil {
			m := new(dns.Msg)
			if m.Unpack(p) == nil && m.Id == q.Id {
				return m
			}
		}
	}
}

// answerARP answers f if it is an ARP request for ip, the attacker's
// address, as a guest's stack would, and says whether it was.
func (a *attacker) answerARP(f []byte, ip netip.Addr) bool {
	if len(f) < 14+28 || binary.BigEndian.Uint16(f[12:]) != etherARP || binary.BigEndian.Uint16(f[20:]) != 1 ||
		netip.AddrFrom4([4]byte(f[38:42])) != ip {
		return false
	}
	sha, spa := net.HardwareAddr(slices.Clone(f[22:28])), netip.AddrFrom4([4]byte(f[28:32]))
	a.send(ether(sha, a.mac, etherARP, arp(2, a.mac, ip, sha, spa)))
	return true
}

// udpPayload returns the payload of an IPv4 UDP frame from port sport to
// port dport, or nil.
func udpPayload(f []byte, sport, dport uint16) []byte {
	if len(f) < 14+20+8 || binary.BigEndian.Uint16(f[12:]) != etherIPv4 {
		return nil
	}
	ip := f[14:]
	ihl := int(ip[0]&0x0f) * 4
	if ip[9] != 17 || len(ip) < ihl+8 || binary.BigEndian.Uint16(ip[ihl:]) != sport || binary.BigEndian.Uint16(ip[ihl+2:]) != dport {
		return nil
	}
	return ip[ihl+8:]
}

// eui64 is the address of mac's EUI-64 interface identifier in prefix
// (fe80::/64 for its link-local address).
func eui64(prefix netip.Prefix, mac net.HardwareAddr) netip.Addr {
	b := prefix.Masked().Addr().As16()
	b[8], b[9], b[10], b[11], b[12] = mac[0]^2, mac[1], mac[2], 0xff, 0xfe
	b[13], b[14], b[15] = mac[3], mac[4], mac[5]
	return netip.AddrFrom16(b)
}

// icmp6 is an IPv6 packet (hop limit 255) carrying the ICMPv6 message msg,
// whose checksum it fills in.
func icmp6(src, dst netip.Addr, msg []byte) []byte {
	h := make([]byte, 40, 40+len(msg))
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:], uint16(len(msg)))
	h[6], h[7] = 58, 255
	copy(h[8:], src.AsSlice())
	copy(h[24:], dst.AsSlice())
	pseudo := append(append(append([]byte{}, src.AsSlice()...), dst.AsSlice()...), 0, 0, byte(len(msg)>>8), byte(len(msg)), 0, 0, 0, 58)
	binary.BigEndian.PutUint16(msg[2:], checksum(append(pseudo, msg...)))
	return append(h, msg...)
}

// neighborAdvert says, to all nodes, that target is at mac (override set).
func neighborAdvert(mac net.HardwareAddr, src, target netip.Addr) []byte {
	m := make([]byte, 24, 32)
	m[0] = 136
	m[4] = 0x20
	copy(m[8:], target.AsSlice())
	m = append(append(m, 2, 1), mac...)
	return ether(net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}, mac, etherIPv6, icmp6(src, netip.MustParseAddr("ff02::1"), m))
}

// dadSolicit is a duplicate address detection probe of target from mac.
func dadSolicit(mac net.HardwareAddr, target netip.Addr) []byte {
	m := make([]byte, 24)
	m[0] = 135
	copy(m[8:], target.AsSlice())
	t := target.As16()
	dst := netip.AddrFrom16([16]byte{0xff, 0x02, 11: 1, 12: 0xff, 13: t[13], 14: t[14], 15: t[15]})
	return ether(net.HardwareAddr{0x33, 0x33, 0xff, t[13], t[14], t[15]}, mac, etherIPv6, icmp6(netip.IPv6Unspecified(), dst, m))
}
