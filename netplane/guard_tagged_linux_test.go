package netplane

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/mdlayher/ndp"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/nd6"
	"github.com/vmnetctl/vmnetctl/rawsock"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// A guest may wrap any frame it writes in VLAN tags. The guard's tests
// below replay the hostile guest's frames (test/hostile) as they are and
// wrapped, on a shared, a host and an isolated network, from a guest that
// uses its own MAC and its own bound addresses: every one must be dropped
// and counted at its port, and nothing of the victim's or the host's may
// change.

// vlanTag is one 802.1Q or 802.1ad tag: its TPID and its TCI (priority
// and VLAN ID).
type vlanTag struct{ tpid, tci uint16 }

// encapsulations are the wrappings every case is sent in.
var encapsulations = []struct {
	name string
	tags []vlanTag
}{
	{"untagged", nil},
	{"vlan 0", []vlanTag{{0x8100, 0}}},              // a priority tag: Linux takes it as untagged
	{"vlan 0 prio 5", []vlanTag{{0x8100, 5 << 13}}}, // the same with a priority
	{"vlan 5", []vlanTag{{0x8100, 5}}},
	{"802.1ad", []vlanTag{{0x88a8, 0}}},
	{"802.1ad, 802.1Q", []vlanTag{{0x88a8, 7}, {0x8100, 0}}},
	{"802.1Q, 802.1Q", []vlanTag{{0x8100, 0}, {0x8100, 0}}},
}

// tagged is frame with tags inserted after its MACs, outermost first.
func tagged(frame []byte, tags []vlanTag) []byte {
	out := append([]byte(nil), frame[:12]...)
	for _, t := range tags {
		out = binary.BigEndian.AppendUint16(out, t.tpid)
		out = binary.BigEndian.AppendUint16(out, t.tci)
	}
	return append(out, frame[12:]...)
}

// ether4 is an Ethernet frame of type typ.
func etherFrame(dst, src net.HardwareAddr, typ uint16, payload []byte) []byte {
	f := append(append([]byte(nil), dst...), src...)
	f = binary.BigEndian.AppendUint16(f, typ)
	return append(f, payload...)
}

// ipv4UDPPacket is an IPv4 UDP packet (UDP checksum 0: none).
func ipv4UDPPacket(src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	u := binary.BigEndian.AppendUint16(nil, sport)
	u = binary.BigEndian.AppendUint16(u, dport)
	u = binary.BigEndian.AppendUint16(u, uint16(8+len(payload)))
	u = append(u, 0, 0)
	return ipv4Packet(src, dst, unix.IPPROTO_UDP, append(u, payload...))
}

func ipv4Packet(src, dst netip.Addr, proto byte, payload []byte) []byte {
	h := make([]byte, 20, 20+len(payload))
	h[0] = 0x45
	binary.BigEndian.PutUint16(h[2:], uint16(20+len(payload)))
	h[8], h[9] = 64, proto
	copy(h[12:], src.AsSlice())
	copy(h[16:], dst.AsSlice())
	var s uint32
	for i := 0; i < 20; i += 2 {
		s += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	binary.BigEndian.PutUint16(h[10:], ^uint16(s))
	return append(h, payload...)
}

// arpPacket is an ARP message (op 1 request, 2 reply).
func arpPacket(op uint16, sha net.HardwareAddr, spa netip.Addr, tha net.HardwareAddr, tpa netip.Addr) []byte {
	p := []byte{0, 1, 8, 0, 6, 4}
	p = binary.BigEndian.AppendUint16(p, op)
	p = append(append(p, sha...), spa.AsSlice()...)
	return append(append(p, tha...), tpa.AsSlice()...)
}

// rogueRA is a router advertisement from src (mac): a default router of
// high preference for 1800 s, and the autonomous prefix prefix.
func rogueRA(t testing.TB, mac net.HardwareAddr, src netip.Addr, prefix netip.Prefix) []byte {
	t.Helper()
	ra := &ndp.RouterAdvertisement{
		CurrentHopLimit: 64, RouterSelectionPreference: ndp.High, RouterLifetime: 1800 * time.Second,
		Options: []ndp.Option{
			&ndp.PrefixInformation{PrefixLength: 64, OnLink: true, AutonomousAddressConfiguration: true,
				ValidLifetime: 24 * time.Hour, PreferredLifetime: 4 * time.Hour, Prefix: prefix.Addr()},
			&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: mac},
		},
	}
	msg, err := ndp.MarshalMessage(ra)
	if err != nil {
		t.Fatal(err)
	}
	binary.BigEndian.PutUint16(msg[2:], nd6.Checksum(append(src.AsSlice(), allNodes.AsSlice()...), msg))
	h := make([]byte, 40)
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:], uint16(len(msg)))
	h[6], h[7] = unix.IPPROTO_ICMPV6, 255
	copy(h[8:], src.AsSlice())
	copy(h[24:], allNodes.AsSlice())
	return etherFrame(nd6AllNodesMAC, mac, unix.ETH_P_IPV6, append(h, msg...))
}

// frameCapture records every frame a namespace's eth0 receives.
type frameCapture struct {
	mu     sync.Mutex
	frames [][]byte
}

func captureFrames(t *testing.T, v *testutil.NS) *frameCapture {
	t.Helper()
	c := &frameCapture{}
	var fd int
	v.MustDo(t, func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(rawsock.Proto(unix.ETH_P_ALL)))
		if err != nil {
			return err
		}
		// Reads wake up now and then to see whether the capture ends:
		// closing a packet socket does not wake a read blocked on it.
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 100_000}); err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: rawsock.Proto(unix.ETH_P_ALL), Ifindex: ifi.Index})
	})
	done := make(chan struct{})
	var stop atomic.Bool
	t.Cleanup(func() { stop.Store(true); <-done; unix.Close(fd) })
	go func() {
		defer close(done)
		buf := make([]byte, 65536)
		for !stop.Load() {
			n, from, err := unix.Recvfrom(fd, buf, 0)
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil || n == 0 {
				return
			}
			if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
				continue
			}
			c.mu.Lock()
			c.frames = append(c.frames, append([]byte(nil), buf[:n]...))
			c.mu.Unlock()
		}
	}()
	return c
}

// holding counts the frames received that hold b.
func (c *frameCapture) holding(b []byte) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, f := range c.frames {
		if bytes.Contains(f, b) {
			n++
		}
	}
	return n
}

// taggedLab is one network with a victim and an attacker, both guarded
// VMs with a real stack and their own leases.
type taggedLab struct {
	n                *api.Network
	nw               *Network
	host             *testutil.NS
	victim, attacker *testutil.NS
	vmac, amac       net.HardwareAddr
	vip, aip         netip.Addr
	vglobal, aLL     netip.Addr
	send             *testutil.RawSender
	capture          *frameCapture
	sentinels        int
}

func newTaggedLab(t *testing.T, n *api.Network) *taggedLab {
	l := &taggedLab{n: n, host: testutil.NewNS(t, "tg-"+n.ID)}
	l.nw = start(t, l.host, n, Options{StateDir: t.TempDir(), Upstreams: []string{"127.0.0.1:53"}})
	l.vmac, l.amac = mustMAC("52:55:55:00:0b:01"), mustMAC("52:55:55:00:0b:02")
	l.victim = g6VM(t, l.host, n, "v"+n.ID, l.vmac.String())
	l.attacker = g6VM(t, l.host, n, "a"+n.ID, l.amac.String())
	l.vip = netip.MustParseAddr(mustUdhcpc(t, l.victim, "")["ip"])
	l.aip = netip.MustParseAddr(mustUdhcpc(t, l.attacker, "")["ip"])
	l.vglobal = g6Addr(t, l.victim, "global")
	l.aLL = g6Addr(t, l.attacker, "link")
	// The attacker's link-local address is its own (the learner bound
	// it): its frames from it pass the guard as the attacker's.
	testutil.Eventually(t, 10*time.Second, func() error {
		if o, _ := l.nw.guard6.Learner.Owner(l.aLL); o.String() != l.amac.String() {
			return fmt.Errorf("%s is bound to %q", l.aLL, o)
		}
		return nil
	}, "the attacker's link-local address to be bound to it")
	// The host's neighbour entry for the victim, and the victim's for
	// the gateway.
	l.host.MustRun(t, "ping", "-c", "1", "-W", "5", l.vglobal.String())
	l.victim.MustRun(t, "ping", "-c", "1", "-W", "5", n.Gateway.String())
	l.send = newRawSender(t, l.attacker)
	l.capture = captureFrames(t, l.victim)
	return l
}

// drops is the attacker's port's drop counter.
func (l *taggedLab) drops(t *testing.T) uint64 {
	return g6Drops(t, l.host, l.n, "a"+l.n.ID)
}

// sentinel has the attacker send the victim a frame the guard lets
// through, until the victim has it: frames sent before it, on the same
// path, have arrived by then. Not on an isolated network, where nothing
// of the attacker's reaches the victim.
func (l *taggedLab) sentinel(t *testing.T) {
	t.Helper()
	if l.n.Isolation {
		return
	}
	l.sentinels++
	payload := fmt.Appendf(nil, "sentinel %d of the attacker", l.sentinels)
	f := etherFrame(l.vmac, l.amac, unix.ETH_P_IP, ipv4UDPPacket(l.aip, l.vip, 4000, 9, payload))
	testutil.Eventually(t, 10*time.Second, func() error {
		if l.capture.holding(payload) == 0 {
			l.send.Send(t, f)
			return fmt.Errorf("the victim has not received the attacker's %q", payload)
		}
		return nil
	}, "the sentinel frame")
}

// state is what the attack must not change: the victim's IPv6 routes and
// addresses, its neighbour entry for the gateway, and the host's for the
// victim's IPv6 address (each without what changes on its own: lifetimes,
// entry states).
func (l *taggedLab) state(t *testing.T) string {
	t.Helper()
	var addrs []string
	for _, line := range strings.Split(l.victim.MustRun(t, "ip", "-6", "-o", "addr", "show", "dev", "eth0"), "\n") {
		if f := strings.Fields(line); len(f) > 3 {
			addrs = append(addrs, f[3])
		}
	}
	return strings.Join([]string{
		expiresRe.ReplaceAllString(l.victim.MustRun(t, "ip", "-6", "route", "show"), ""),
		strings.Join(addrs, " "),
		"victim: gateway at " + lladdr(l.victim.MustRun(t, "ip", "neigh", "show", l.n.Gateway.String())),
		"host: victim at " + lladdr(l.host.MustRun(t, "ip", "-6", "neigh", "show", l.vglobal.String())),
	}, "\n")
}

var expiresRe = regexp.MustCompile(`expires \d+sec `)

// lladdr is the MAC of an `ip neigh show` line, or "none".
func lladdr(out string) string {
	f := strings.Fields(out)
	for i := range len(f) - 1 {
		if f[i] == "lladdr" {
			return f[i+1]
		}
	}
	return "none"
}

// hostileCase is a frame a hostile guest sends, on its own or many times.
type hostileCase struct {
	name   string
	frames [][]byte
	// limited: a rate limit, not a rule, drops these untagged (the
	// DHCP flood): its rate's worth passes, and they may reach the
	// victim.
	limited bool
}

// cases are the hostile guest's frames from its own MAC and, but for the
// spoofed ones, its own bound addresses.
func (l *taggedLab) cases(t *testing.T) []hostileCase {
	bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	all4 := netip.MustParseAddr("255.255.255.255")
	rogue := netip.MustParsePrefix("fd66:6666:6666:6666::/64")
	offer, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeOffer), dhcpv4.WithHwAddr(l.vmac),
		dhcpv4.WithYourIP(net.IP(l.vip.AsSlice())), dhcpv4.WithOption(dhcpv4.OptRouter(net.IP(l.aip.AsSlice()))),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IP(l.aip.AsSlice()))))
	flood := make([][]byte, 2000)
	for i := range flood {
		disc, _ := dhcpv4.NewDiscovery(l.amac)
		flood[i] = etherFrame(bcast, l.amac, unix.ETH_P_IP, ipv4UDPPacket(netip.IPv4Unspecified(), all4, 68, 67, disc.ToBytes()))
	}
	sn, snm := solicitedNode(l.vglobal)
	zero := net.HardwareAddr{0, 0, 0, 0, 0, 0}
	return []hostileCase{
		{name: "router advertisement", frames: [][]byte{rogueRA(t, l.amac, l.aLL, rogue)}},
		{name: "neighbour advertisement of the victim's address", frames: [][]byte{
			nd6Frame(t, l.amac, nd6AllNodesMAC, l.aLL, allNodes, 255, ipv6.ICMPTypeNeighborAdvertisement, 0x20, l.vglobal, nd6LLA(2, l.amac))}},
		{name: "duplicate address detection of the victim's address", frames: [][]byte{dadNS(t, l.amac, l.vglobal, nd6LLA(1, l.amac))}},
		{name: "neighbour solicitation from the victim's address", frames: [][]byte{
			nd6Frame(t, l.amac, snm, l.vglobal, sn, 255, ipv6.ICMPTypeNeighborSolicitation, 0, l.n.Gateway6, nd6LLA(1, l.amac))}},
		{name: "DHCP offer", frames: [][]byte{etherFrame(bcast, l.amac, unix.ETH_P_IP, ipv4UDPPacket(l.aip, all4, 67, 68, offer.ToBytes()))}},
		{name: "DHCP ACK to the victim", frames: [][]byte{etherFrame(l.vmac, l.amac, unix.ETH_P_IP, ipv4UDPPacket(l.aip, l.vip, 68, 68, offer.ToBytes()))}},
		{name: "DHCPv6 answer", frames: [][]byte{etherFrame(l.vmac, l.amac, unix.ETH_P_IPV6, ip6UDP(l.aLL, allNodes, 547, 546, []byte("dhcpv6 reply")))}},
		{name: "ARP: the gateway is at me", frames: [][]byte{etherFrame(bcast, l.amac, unix.ETH_P_ARP, arpPacket(2, l.amac, l.n.Gateway, bcast, l.n.Gateway))}},
		{name: "ARP: the victim is at me", frames: [][]byte{etherFrame(l.vmac, l.amac, unix.ETH_P_ARP, arpPacket(2, l.amac, l.vip, l.vmac, l.vip))}},
		{name: "ARP from the victim's MAC", frames: [][]byte{etherFrame(bcast, l.vmac, unix.ETH_P_ARP, arpPacket(1, l.vmac, l.vip, zero, l.n.Gateway))}},
		{name: "IPv4 from the victim's address", frames: [][]byte{etherFrame(l.vmac, l.amac, unix.ETH_P_IP, ipv4UDPPacket(l.vip, l.vip, 5, 6, []byte("spoofed v4 source")))}},
		{name: "IPv6 from the victim's address", frames: [][]byte{etherFrame(l.vmac, l.amac, unix.ETH_P_IPV6, ip6UDP(l.vglobal, l.vglobal, 5, 6, []byte("spoofed v6 source")))}},
		{name: "DHCP flood", frames: flood, limited: true},
	}
}

// ip6UDP is an IPv6 packet with a UDP datagram (its checksum left 0:
// receivers drop it, the guard looks at the headers only).
func ip6UDP(src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	h := make([]byte, 40)
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:], uint16(8+len(payload)))
	h[6], h[7] = unix.IPPROTO_UDP, 64
	copy(h[8:], src.AsSlice())
	copy(h[24:], dst.AsSlice())
	u := binary.BigEndian.AppendUint16(nil, sport)
	u = binary.BigEndian.AppendUint16(u, dport)
	u = binary.BigEndian.AppendUint16(u, uint16(8+len(payload)))
	u = append(u, 0, 0)
	return append(append(h, u...), payload...)
}

// attack sends frames (a case in one wrapping, of base) and checks that
// the guard dropped and counted each and, unless c is limited (the
// flood's untagged frames that passed its rate limit reach the victim,
// and are the same frames), that none reached the victim. Untagged, a
// limited case's frames pass at the port's rate (20 a second after a
// burst of 40, for as long as the sending took).
func (l *taggedLab) attack(t *testing.T, what string, c hostileCase, frames [][]byte) {
	t.Helper()
	before := l.drops(t)
	start := time.Now()
	l.send.Send(t, frames...)
	passes := uint64(0)
	if c.limited && bytes.Equal(frames[0], c.frames[0]) {
		passes = 40 + 20*uint64(time.Since(start).Seconds()+2)
	}
	l.sentinel(t)
	want := before + uint64(len(frames)) - min(passes, uint64(len(frames)))
	testutil.Eventually(t, 10*time.Second, func() error {
		if d := l.drops(t); d < want {
			return fmt.Errorf("%s: the attacker's port dropped %d of %d frames, want %d", what, d-before, len(frames), want-before)
		}
		return nil
	}, "the guard to drop and count "+what)
	if c.limited {
		return
	}
	for i, f := range c.frames {
		if n := l.capture.holding(f[14:]); n > 0 {
			t.Errorf("%s: frame %d reached the victim %d times", what, i, n)
			break
		}
	}
}

func taggedNetworks() []*api.Network {
	shared := g6Net()
	shared.ID, shared.Name = "tgs", "tgs"
	host := testNet("tgh", api.ModeHost, "10.200.10.0/24")
	isolated := testNet("tgi", api.ModeHost, "10.200.11.0/24")
	isolated.Isolation = true
	for i, n := range []*api.Network{host, isolated} {
		n.Subnet6 = netip.MustParsePrefix(fmt.Sprintf("fd00:9%d::/64", i))
		n.Gateway6 = api.Gateway6(n.Subnet6)
		n.RouterAdvertisement = true
	}
	return []*api.Network{shared, host, isolated}
}

// TestGuardTaggedFrames: every hostile guest's frame, untagged and in
// every wrapping of VLAN tags, on a shared, a host and an isolated
// network, is dropped and counted at the attacker's port, reaches no
// neighbour, and changes neither the victim's routes, addresses and
// neighbours nor the host's. Tagged router and neighbour advertisements
// and DHCP answers from the attacker's own MAC and addresses got through
// before the guard dropped tagged frames first (issue 37).
func TestGuardTaggedFrames(t *testing.T) {
	needRoot(t)
	for _, n := range taggedNetworks() {
		t.Run(string(n.Mode)+map[bool]string{true: "-isolated"}[n.Isolation], func(t *testing.T) {
			t.Parallel()
			l := newTaggedLab(t, n)
			l.sentinel(t) // the control: the path works
			before := l.state(t)
			for _, c := range l.cases(t) {
				for _, e := range encapsulations {
					frames := make([][]byte, len(c.frames))
					for i, f := range c.frames {
						frames[i] = tagged(f, e.tags)
					}
					l.attack(t, c.name+" ("+e.name+")", c, frames)
				}
			}
			// The victim's kernel handles what arrived (a router
			// advertisement, a neighbour advertisement) in its own
			// time: state is read after a ping, which the victim
			// answers after what came before it.
			l.host.MustRun(t, "ping", "-c", "1", "-W", "5", l.vglobal.String())
			if after := l.state(t); after != before {
				t.Errorf("the attack changed the victim's or the host's state:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
}

// TestGuardFuzzEncapsulations sends random stacks of tags (any TPID, the
// ones the kernel takes out of the frame among them, any TCI) around the
// hostile guest's frames and some random Ethernet types: each frame is
// dropped and counted, and the victim's and the host's state stay as they
// were. Seeded: a failure names its seed, and VMNETCTL_FUZZ_SEED replays
// it.
func TestGuardFuzzEncapsulations(t *testing.T) {
	needRoot(t)
	n := g6Net()
	n.ID, n.Name = "tgf", "tgf"
	l := newTaggedLab(t, n)
	before := l.state(t)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("VMNETCTL_FUZZ_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("VMNETCTL_FUZZ_SEED=%q: %v", s, err)
		}
	}
	t.Logf("seed %d (replay with VMNETCTL_FUZZ_SEED=%d)", seed, seed)
	r := rand.New(rand.NewPCG(seed, seed))
	cases := l.cases(t)
	tpids := []uint16{0x8100, 0x88a8, 0x9100, 0x9200, 0x8100, 0x88a8}
	for i := range 200 {
		c := cases[r.IntN(len(cases)-1)] // not the flood
		base := c.frames[0]
		var tags []vlanTag
		for range 1 + r.IntN(3) {
			tpid := tpids[r.IntN(len(tpids))]
			if r.IntN(8) == 0 {
				tpid = uint16(r.Uint32())
			}
			tags = append(tags, vlanTag{tpid, uint16(r.Uint32())})
		}
		l.attack(t, fmt.Sprintf("input %d: %s in tags %04x", i, c.name, tags), hostileCase{name: c.name, frames: [][]byte{base}}, [][]byte{tagged(base, tags)})
		if t.Failed() {
			break
		}
	}
	l.host.MustRun(t, "ping", "-c", "1", "-W", "5", l.vglobal.String())
	if after := l.state(t); after != before {
		t.Errorf("the inputs changed the victim's or the host's state:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}
