package nd6

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/test/testutil"
	"golang.org/x/net/bpf"
	"golang.org/x/net/ipv6"
)

// The learner tests: unit tests of the parser, the filter and the binding
// rules (no root), and a lab of namespaces where the learner runs on a
// bridge ("host") with two VMs: A, a guest whose kernel does DAD, and B, a
// hostile one that writes raw frames. No packet leaves them.

var nd6Prefix = netip.MustParsePrefix("fd00:1:2:3::/64")

func nd6IP(s string) netip.Addr { return netip.MustParseAddr(s) }

func nd6MAC(s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

// The frames a guest writes, and its raw socket (testutil's).
var (
	nd6Frame       = testutil.ND6Frame
	nd6LLA         = testutil.ND6LLA
	solicitedNode  = testutil.SolicitedNode
	dadNS          = testutil.DADNS
	nd6AllNodesMAC = testutil.AllNodesMAC
	newRawSender   = testutil.NewRawSender
	allNodes       = netip.MustParseAddr("ff02::1")
	allRouters     = netip.MustParseAddr("ff02::2")
	nd6Unspec      = netip.IPv6Unspecified()
)

// mustDo runs f in namespace n and fails the test on error. f must not
// call t.Fatal: it runs on another goroutine.
func mustDo(t *testing.T, n *testutil.NS, f func() error) {
	t.Helper()
	if err := n.Do(f); err != nil {
		t.Fatalf("in %s: %v", n, err)
	}
}

// ipv6Sysctls sets net.ipv6.conf.<iface>.<key> to value, for each key and
// value of kv, in the calling thread's namespace.
func ipv6Sysctls(iface string, kv ...string) error {
	for i := 0; i+1 < len(kv); i += 2 {
		if err := os.WriteFile(fmt.Sprintf("/proc/sys/net/ipv6/conf/%s/%s", iface, kv[i]), []byte(kv[i+1]), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// unsolNA is an unsolicited advertisement of target from mac (override
// flag, to all-nodes), with mac as target link-layer address.
func unsolNA(t testing.TB, mac net.HardwareAddr, src, target netip.Addr, hopLimit byte) []byte {
	return nd6Frame(t, mac, nd6AllNodesMAC, src, allNodes, hopLimit, ipv6.ICMPTypeNeighborAdvertisement, 0x20, target, nd6LLA(2, mac))
}

// nd6Cases are messages and what parseND6 makes of them, for the parser
// and the filter tests.
func nd6Cases(t testing.TB) []struct {
	name   string
	frame  []byte
	want   netip.Addr // the claim; invalid: none
	filter bool       // whether the socket filter passes it
} {
	mac, other := nd6MAC("52:54:00:12:34:56"), nd6MAC("52:54:00:ab:cd:ef")
	ll, target := nd6IP("fe80::1"), nd6IP("fd00:1:2:3::42")
	g, gm := solicitedNode(target)
	ns := ipv6.ICMPTypeNeighborSolicitation
	na := ipv6.ICMPTypeNeighborAdvertisement
	badSum := unsolNA(t, mac, ll, target, 255)
	badSum[len(badSum)-1] ^= 1
	short := unsolNA(t, mac, ll, target, 255)
	binary.BigEndian.PutUint16(short[14+4:], 200) // payload length past the frame
	padded := append(dadNS(t, mac, target), make([]byte, 12)...)
	type c = struct {
		name   string
		frame  []byte
		want   netip.Addr
		filter bool
	}
	return []c{
		{"DAD NS", dadNS(t, mac, target), target, true},
		{"DAD NS, Ethernet padding", padded, target, true},
		{"DAD NS with a source LLA", dadNS(t, mac, target, nd6LLA(1, mac)), netip.Addr{}, true},
		{"DAD NS to all-nodes", nd6Frame(t, mac, nd6AllNodesMAC, nd6Unspec, allNodes, 255, ns, 0, target), netip.Addr{}, true},
		{"NS from a unicast source", nd6Frame(t, mac, gm, ll, g, 255, ns, 0, target, nd6LLA(1, mac)), ll, true},
		{"NS with another source LLA", nd6Frame(t, mac, gm, ll, g, 255, ns, 0, target, nd6LLA(1, other)), netip.Addr{}, true},
		{"NS, hop limit 64", nd6Frame(t, mac, gm, ll, g, 64, ns, 0, target), netip.Addr{}, false},
		{"NS for a multicast target", nd6Frame(t, mac, gm, ll, g, 255, ns, 0, allNodes), netip.Addr{}, true},
		{"NA", unsolNA(t, mac, ll, target, 255), target, true},
		{"NA without a target LLA", nd6Frame(t, mac, nd6AllNodesMAC, ll, allNodes, 255, na, 0x20, target), target, true},
		{"NA with another target LLA", nd6Frame(t, mac, nd6AllNodesMAC, ll, allNodes, 255, na, 0x20, target, nd6LLA(2, other)), netip.Addr{}, true},
		{"NA with a source LLA of another", nd6Frame(t, mac, nd6AllNodesMAC, ll, allNodes, 255, na, 0x20, target, nd6LLA(1, other), nd6LLA(2, mac)), target, true},
		{"NA, solicited, to all-nodes", nd6Frame(t, mac, nd6AllNodesMAC, ll, allNodes, 255, na, 0x60, target), netip.Addr{}, true},
		{"NA, hop limit 254", unsolNA(t, mac, ll, target, 254), netip.Addr{}, false},
		{"NA, bad checksum", badSum, netip.Addr{}, true},
		{"NA, payload length past the frame", short, netip.Addr{}, true},
		{"NA, zero-length option", nd6Frame(t, mac, nd6AllNodesMAC, ll, allNodes, 255, na, 0, target, []byte{2, 0, 0, 0, 0, 0, 0, 0}), netip.Addr{}, true},
		{"NA, option past the end", nd6Frame(t, mac, nd6AllNodesMAC, ll, allNodes, 255, na, 0, target, []byte{2, 2, 0, 0, 0, 0, 0, 0}), netip.Addr{}, true},
		{"NA, 16-byte target LLA", nd6Frame(t, mac, nd6AllNodesMAC, ll, allNodes, 255, na, 0, target, append(nd6LLA(2, mac)[:1:1], 2, 0x52, 0x54, 0, 0x12, 0x34, 0x56, 0, 0, 0, 0, 0, 0, 0, 0)), netip.Addr{}, true},
		{"echo request", nd6Frame(t, mac, nd6AllNodesMAC, ll, allNodes, 255, ipv6.ICMPTypeEchoRequest, 0, target), netip.Addr{}, false},
		{"router solicitation", nd6Frame(t, mac, nd6AllNodesMAC, ll, allRouters, 255, ipv6.ICMPTypeRouterSolicitation, 0, target), netip.Addr{}, false},
	}
}

func TestND6Parse(t *testing.T) {
	src := [6]byte(nd6MAC("52:54:00:12:34:56"))
	for _, c := range nd6Cases(t) {
		got, err := parseND6(c.frame[14:], src)
		if got != c.want || (err == nil) != c.want.IsValid() {
			t.Errorf("%s: %v, %v; want %v", c.name, got, err, c.want)
		}
	}
	// A message with a code is invalid; the filter drops it too.
	f := unsolNA(t, net.HardwareAddr(src[:]), nd6IP("fe80::1"), nd6IP("fd00:1:2:3::42"), 255)
	f[14+ipv6.HeaderLen+1] = 1
	if _, err := parseND6(f[14:], src); err == nil {
		t.Error("an NA with code 1 parsed")
	}
}

// TestND6ParseBounds feeds the parser every truncation and many random
// corruptions of valid messages: it must not panic, and what it accepts
// must be a claim of an address in the message.
func TestND6ParseBounds(t *testing.T) {
	src := [6]byte(nd6MAC("52:54:00:12:34:56"))
	r := rand.New(rand.NewPCG(1, 2))
	for _, c := range nd6Cases(t) {
		pkt := c.frame[14:]
		for n := range len(pkt) {
			if _, err := parseND6(pkt[:n], src); err == nil && n < ipv6.HeaderLen+24 {
				t.Fatalf("%s: %d bytes parsed", c.name, n)
			}
		}
		for range 2000 {
			m := slices.Clone(pkt)
			for range 1 + r.IntN(4) {
				m[r.IntN(len(m))] = byte(r.Uint32())
			}
			if a, err := parseND6(m, src); err == nil {
				b := a.As16()
				if string(b[:]) != string(m[8:24]) && string(b[:]) != string(m[ipv6.HeaderLen+8:ipv6.HeaderLen+24]) {
					t.Fatalf("%s: claim %v not in the message %x", c.name, a, m)
				}
			}
		}
	}
}

// TestND6Filter runs the socket filter in x/net/bpf's VM, which lacks the
// VLAN extension: its load is replaced by "no tag".
func TestND6Filter(t *testing.T) {
	prog := slices.Clone(nd6Filter)
	if _, ok := prog[0].(bpf.LoadExtension); !ok {
		t.Fatalf("the filter does not start with the VLAN check: %v", prog[0])
	}
	prog[0] = bpf.LoadConstant{Dst: bpf.RegA, Val: 0}
	vm, err := bpf.NewVM(prog)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bpf.Assemble(nd6Filter); err != nil {
		t.Fatal(err)
	}
	for _, c := range nd6Cases(t) {
		n, err := vm.Run(c.frame[14:])
		if err != nil || (n != 0) != c.filter {
			t.Errorf("%s: filter gives %d, %v; want pass %v", c.name, n, err, c.filter)
		}
	}
	v4 := slices.Clone(nd6Cases(t)[0].frame[14:])
	v4[0] = 0x45
	if n, _ := vm.Run(v4); n != 0 {
		t.Errorf("an IPv4 packet passes")
	}
	if n, _ := vm.Run(v4[:20]); n != 0 {
		t.Errorf("a short packet passes")
	}
}

// nd6Recorder records what onChange is told, and whether it ever ran twice
// at once.
type nd6Recorder struct {
	mu         sync.Mutex
	events     []Event
	inside     atomic.Int32
	concurrent atomic.Bool
}

func (r *nd6Recorder) onChange(events []Event) {
	if r.inside.Add(1) != 1 {
		r.concurrent.Store(true)
	}
	defer r.inside.Add(-1)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, events...)
}

// count is how many events of ip (any, if invalid) for mac with added.
func (r *nd6Recorder) count(mac net.HardwareAddr, ip netip.Addr, added bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if e.Added == added && e.Binding.MAC.String() == mac.String() && (!ip.IsValid() || e.Binding.IP == ip) {
			n++
		}
	}
	return n
}

func (r *nd6Recorder) event(mac net.HardwareAddr, ip netip.Addr, added bool) func() bool {
	return func() bool { return r.count(mac, ip, added) > 0 }
}

// TestND6Rules checks the binding rules on a learner without a socket,
// with times of its own.
func TestND6Rules(t *testing.T) {
	rec := &nd6Recorder{}
	l, err := newTable(nd6Prefix, time.Minute, rec.onChange, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	a, b := [6]byte(nd6MAC("52:54:00:00:01:01")), [6]byte(nd6MAC("52:54:00:00:01:02"))
	ip := nd6IP("fd00:1:2:3::10")
	l.Claim(a, ip, t0)
	l.Claim(b, ip, t0.Add(30*time.Second))
	if m, ok := l.Owner(ip); !ok || [6]byte(m) != a {
		t.Fatalf("owner after a second claim: %v %v", m, ok)
	}
	l.Claim(a, ip, t0.Add(50*time.Second)) // refreshed: expires at 1m50
	if bs := l.Bindings(); len(bs) != 1 || !bs[0].Expires.Equal(t0.Add(110*time.Second)) {
		t.Fatalf("bindings after a refresh: %v", bs)
	}
	// Expired but not swept: another MAC takes it.
	l.Claim(b, ip, t0.Add(110*time.Second))
	if m, _ := l.Owner(ip); [6]byte(m) != b {
		t.Fatalf("owner after expiry: %v", m)
	}
	l.expire(t0.Add(170 * time.Second))
	if len(l.Bindings()) != 0 {
		t.Fatalf("bindings after the sweep: %v", l.Bindings())
	}
	if claims, conflicts, dropped := l.Stats(); claims != 4 || conflicts != 1 || dropped != 0 {
		t.Fatalf("stats: %d claims, %d conflicts, %d dropped", claims, conflicts, dropped)
	}
	// Not learned: outside the prefix, the subnet-router anycast address,
	// the host's own, link-local outside fe80::/64.
	l.hostIPs = map[netip.Addr]bool{nd6IP("fd00:1:2:3::1"): true}
	for _, s := range []string{"fd00:1:2:4::10", "fd00:1:2:3::", "fd00:1:2:3::1", "fe80:0:0:1::10", "2001:db8::1", "::ffff:10.0.0.1"} {
		l.Claim(a, nd6IP(s), t0)
	}
	l.Claim(a, nd6IP("fe80::10"), t0)
	if bs := l.Bindings(); len(bs) != 1 || bs[0].IP != nd6IP("fe80::10") || l.Lookup(net.HardwareAddr(a[:])) != nil {
		t.Fatalf("bindings: %v, lookup %v", bs, l.Lookup(net.HardwareAddr(a[:])))
	}
	l.deliver()
	want := []string{"+fd00:1:2:3::10", "-fd00:1:2:3::10", "+fd00:1:2:3::10", "-fd00:1:2:3::10", "+fe80::10"}
	var got []string
	for _, e := range rec.events {
		got = append(got, map[bool]string{true: "+", false: "-"}[e.Added]+e.Binding.IP.String())
	}
	if !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}

	// At most nd6MaxPerMAC per MAC: the least recently claimed goes.
	l.Forget(net.HardwareAddr(a[:]))
	for i := range nd6MaxPerMAC + 1 {
		now := t0.Add(time.Duration(i+1) * time.Second)
		l.Claim(a, nd6IP("fd00:1:2:3::11"), now) // claimed again each time
		l.Claim(a, netip.AddrFrom16([16]byte{0xfd, 0, 0, 1, 0, 2, 0, 3, 15: byte(0x20 + i)}), now)
	}
	lk := l.Lookup(net.HardwareAddr(a[:]))
	if len(lk) != nd6MaxPerMAC || !slices.Contains(lk, nd6IP("fd00:1:2:3::11")) ||
		slices.Contains(lk, nd6IP("fd00:1:2:3::20")) || slices.Contains(lk, nd6IP("fd00:1:2:3::21")) {
		t.Fatalf("lookup after %d addresses claimed: %v", nd6MaxPerMAC+2, lk)
	}

	// At most nd6MaxBindings in all.
	l.Forget(net.HardwareAddr(a[:]))
	l.hostIPs = nil
	for i := range nd6MaxBindings + 16 {
		mac := [6]byte{0x52, 0x54, 0, 1, byte(i >> 12), byte(i >> 4)} // 16 addresses a MAC
		l.Claim(mac, netip.AddrFrom16([16]byte{0xfd, 0, 0, 1, 0, 2, 0, 3, 14: byte((i + 1) >> 8), 15: byte(i + 1)}), t0)
	}
	if n := len(l.Bindings()); n != nd6MaxBindings {
		t.Fatalf("%d bindings, want %d", n, nd6MaxBindings)
	}
	if _, _, dropped := l.Stats(); dropped != 16 {
		t.Fatalf("%d dropped, want 16", dropped)
	}
	// A MAC at its limit still replaces its own.
	full := [6]byte{0x52, 0x54, 0, 1, 0, 0}
	l.Claim(full, nd6IP("fd00:1:2:3:ffff::1"), t0.Add(time.Second))
	if o, ok := l.Owner(nd6IP("fd00:1:2:3:ffff::1")); !ok || [6]byte(o) != full || len(l.Lookup(full[:])) != nd6MaxPerMAC {
		t.Fatalf("a full MAC's new claim: %v %v, %d addresses", o, ok, len(l.Lookup(full[:])))
	}
}

// nd6Lab is a host namespace with the bridge br0 (multicast snooping off,
// fd00:1:2:3::1) and VM namespaces, each eth0 the peer of a port of br0.
type nd6Lab struct {
	host *testutil.NS
	vms  []*testutil.NS
}

// newND6Lab makes the lab with a VM per MAC; sysctls are set on each VM's
// eth0 (before it is up). The VMs' links are down: up brings them up.
func newND6Lab(t *testing.T, macs []string, sysctls [][]string) *nd6Lab {
	t.Helper()
	l := &nd6Lab{host: testutil.NewNS(t, "nd6-host")}
	l.host.MustRun(t, "ip", "link", "add", "br0", "type", "bridge", "mcast_snooping", "0")
	l.host.MustRun(t, "ip", "addr", "add", "fd00:1:2:3::1/64", "dev", "br0", "nodad")
	l.host.MustRun(t, "ip", "link", "set", "br0", "up")
	for i, mac := range macs {
		v := testutil.NewNS(t, fmt.Sprintf("nd6-vm%d", i))
		port := fmt.Sprintf("p%d", i)
		testutil.Run(t, "ip", "-n", l.host.Name, "link", "add", port, "type", "veth", "peer", "name", "eth0", "address", mac, "netns", v.Name)
		l.host.MustRun(t, "ip", "link", "set", port, "master", "br0", "up")
		mustDo(t, v, func() error { return ipv6Sysctls("eth0", sysctls[i]...) })
		l.vms = append(l.vms, v)
	}
	return l
}

func (l *nd6Lab) up(t *testing.T) {
	t.Helper()
	for _, v := range l.vms {
		v.MustRun(t, "ip", "link", "set", "eth0", "up")
	}
}

// start starts a learner on br0 and closes it on cleanup.
func (l *nd6Lab) start(t *testing.T, lifetime time.Duration, rec *nd6Recorder) *Learner {
	t.Helper()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	var ln *Learner
	mustDo(t, l.host, func() (err error) {
		ln, err = Start("br0", nd6Prefix, lifetime, rec.onChange, log)
		return err
	})
	t.Cleanup(func() { ln.Close() })
	return ln
}

func TestND6Learner(t *testing.T) {
	testutil.RequireRoot(t, "creates network namespaces")
	testutil.RequireCommands(t, "ip", "ping")
	start := time.Now()
	macA, macB := nd6MAC("52:54:00:00:0a:01"), nd6MAC("52:54:00:00:0a:02")
	// A does DAD; B, the hostile one, has no IPv6 stack of its own: it
	// only writes raw frames.
	lab := newND6Lab(t, []string{macA.String(), macB.String()},
		[][]string{{"accept_dad", "1", "dad_transmits", "1"}, {"disable_ipv6", "1"}})
	vmA := lab.vms[0]
	b := newRawSender(t, lab.vms[1])
	rec := &nd6Recorder{}
	ln := lab.start(t, time.Minute, rec)
	lab.up(t)
	const wait = 10 * time.Second
	ipA := nd6IP("fd00:1:2:3::10")
	llB := nd6IP("fe80::5054:ff:fe00:a02")

	t.Run("DAD", func(t *testing.T) {
		vmA.MustRun(t, "ip", "-6", "addr", "add", ipA.String()+"/64", "dev", "eth0")
		testutil.Eventually(t, wait, rec.event(macA, ipA, true), "%s learned for %s", ipA, macA)
		if got := ln.Lookup(macA); !slices.Equal(got, []netip.Addr{ipA}) {
			t.Errorf("Lookup(A) = %v, want [%s]", got, ipA)
		}
		if o, ok := ln.Owner(ipA); !ok || o.String() != macA.String() {
			t.Errorf("Owner(%s) = %v, %v", ipA, o, ok)
		}
		// A's link-local address, from its DAD too: bound, not in Lookup.
		testutil.Eventually(t, wait, func() bool {
			return slices.ContainsFunc(ln.Bindings(), func(b Binding) bool {
				return b.IP.IsLinkLocalUnicast() && b.MAC.String() == macA.String()
			})
		}, "A's link-local address learned")
	})

	t.Run("NoDADSolicitation", func(t *testing.T) {
		// An address without DAD is learned from the solicitation A sends
		// to resolve the bridge's address, from it.
		ip := nd6IP("fd00:1:2:3::11")
		vmA.MustRun(t, "ip", "-6", "addr", "add", ip.String()+"/64", "dev", "eth0", "nodad")
		if _, err := vmA.Run(t.Context(), "ping", "-6", "-n", "-c", "1", "-W", "5", "-I", ip.String(), "fd00:1:2:3::1"); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, wait, rec.event(macA, ip, true), "%s learned from a solicitation", ip)
	})

	t.Run("FirstComeFirstServed", func(t *testing.T) {
		_, conflicts0, _ := ln.Stats()
		b.Send(t, dadNS(t, macB, ipA), unsolNA(t, macB, llB, ipA, 255))
		testutil.Eventually(t, wait, func() error {
			if _, c, _ := ln.Stats(); c < conflicts0+2 {
				return fmt.Errorf("%d conflicts", c-conflicts0)
			}
			return nil
		}, "B's two claims of %s refused", ipA)
		if o, _ := ln.Owner(ipA); o.String() != macA.String() {
			t.Errorf("Owner(%s) = %v after B's claims, want A %s", ipA, o, macA)
		}
		if n := rec.count(macB, ipA, true); n != 0 {
			t.Errorf("%s reported bound to B", ipA)
		}
	})

	t.Run("NotLearned", func(t *testing.T) {
		outside, hop64, otherLLA := nd6IP("fd00:9::1"), nd6IP("fd00:1:2:3::20"), nd6IP("fd00:1:2:3::22")
		host, marker := nd6IP("fd00:1:2:3::1"), nd6IP("fd00:1:2:3::21")
		b.Send(t,
			unsolNA(t, macB, llB, outside, 255),
			dadNS(t, macB, outside),
			unsolNA(t, macB, llB, hop64, 64),
			nd6Frame(t, macB, nd6AllNodesMAC, llB, allNodes, 255, ipv6.ICMPTypeNeighborAdvertisement, 0x20, otherLLA, nd6LLA(2, macA)),
			unsolNA(t, macB, llB, host, 255), // the bridge's own
			unsolNA(t, macB, llB, marker, 255))
		// The frames are read in order: once the last is learned, the
		// others were read.
		testutil.Eventually(t, wait, rec.event(macB, marker, true), "%s learned", marker)
		for _, ip := range []netip.Addr{outside, hop64, otherLLA, host} {
			if o, ok := ln.Owner(ip); ok {
				t.Errorf("%s bound to %s", ip, o)
			}
		}
		// Nothing is bound to the bridge (its own DAD, looped back).
		for _, bd := range ln.Bindings() {
			if m := bd.MAC.String(); m != macA.String() && m != macB.String() {
				t.Errorf("binding of %s to %s, not a VM", bd.IP, m)
			}
		}
	})

	t.Run("PerMACLimit", func(t *testing.T) {
		var frames [][]byte
		var ips []netip.Addr
		for i := range nd6MaxPerMAC + 1 {
			ip := netip.AddrFrom16([16]byte{0xfd, 0, 0, 1, 0, 2, 0, 3, 14: 1, 15: byte(i)})
			ips = append(ips, ip)
			frames = append(frames, unsolNA(t, macB, llB, ip, 255))
		}
		b.Send(t, frames...)
		last := ips[len(ips)-1]
		testutil.Eventually(t, wait, rec.event(macB, last, true), "%s learned", last)
		// B held ::21 and now claimed 17 more: the first two went.
		got := ln.Lookup(macB)
		if !slices.Equal(got, ips[1:]) {
			t.Errorf("Lookup(B) = %v, want %v", got, ips[1:])
		}
		for _, gone := range []netip.Addr{nd6IP("fd00:1:2:3::21"), ips[0]} {
			if rec.count(macB, gone, false) != 1 {
				t.Errorf("no removal of %s reported", gone)
			}
		}
		ln.Forget(macB)
		if got := ln.Lookup(macB); len(got) != 0 {
			t.Errorf("Lookup(B) = %v after Forget", got)
		}
		if o, ok := ln.Owner(last); ok {
			t.Errorf("%s still bound to %s after Forget", last, o)
		}
		testutil.Eventually(t, wait, func() bool {
			return rec.count(macB, netip.Addr{}, false) == rec.count(macB, netip.Addr{}, true)
		}, "the removal of B's bindings reported")
		if got := ln.Lookup(macA); !slices.Contains(got, ipA) {
			t.Errorf("Lookup(A) = %v after Forget(B)", got)
		}
	})

	t.Run("Expiry", func(t *testing.T) {
		const lifetime = 2 * time.Second
		rec2 := &nd6Recorder{}
		ln2 := lab.start(t, lifetime, rec2)
		ip := nd6IP("fd00:1:2:3::30")
		b.Send(t, unsolNA(t, macB, llB, ip, 255))
		testutil.Eventually(t, wait, rec2.event(macB, ip, true), "%s learned", ip)
		first := ln2.Bindings()
		// Claimed again: refreshed.
		b.Send(t, unsolNA(t, macB, llB, ip, 255))
		var refreshed time.Time
		testutil.Eventually(t, wait, func() bool {
			for _, bd := range ln2.Bindings() {
				if bd.IP == ip && slices.ContainsFunc(first, func(f Binding) bool { return f.IP == ip && bd.Expires.After(f.Expires) }) {
					refreshed = bd.Expires
					return true
				}
			}
			return false
		}, "%s refreshed", ip)
		testutil.Eventually(t, lifetime+wait, rec2.event(macB, ip, false), "%s expired", ip)
		if now := time.Now(); now.Before(refreshed) {
			t.Errorf("removed at %v, before it expires at %v", now, refreshed)
		}
		if _, ok := ln2.Owner(ip); ok {
			t.Errorf("%s still bound after its removal", ip)
		}
		if err := ln2.Close(); err != nil {
			t.Error(err)
		}
	})

	t.Run("BridgeDownUp", func(t *testing.T) {
		lab.host.MustRun(t, "ip", "link", "set", "br0", "down")
		lab.host.MustRun(t, "ip", "link", "set", "br0", "up")
		ip := nd6IP("fd00:1:2:3::40")
		// B claims until the bridge passes frames up again.
		testutil.Eventually(t, wait, func() bool {
			b.Send(t, unsolNA(t, macB, llB, ip, 255))
			return rec.count(macB, ip, true) > 0
		}, "%s learned after the bridge went down and up", ip)
	})

	t.Run("Close", func(t *testing.T) {
		testutil.Eventually(t, time.Second, func() bool { return testutil.Goroutines("nd6.(*Learner)") == 1 }, "one learner goroutine before Close")
		t0 := time.Now()
		if err := ln.Close(); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(t0); d > time.Second {
			t.Errorf("Close took %v", d)
		}
		testutil.Eventually(t, time.Second, func() bool { return testutil.Goroutines("nd6.(*Learner)") == 0 }, "the learner's goroutine to end")
		if err := ln.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
		// Bindings outlive Close.
		if got := ln.Lookup(macA); !slices.Contains(got, ipA) {
			t.Errorf("Lookup(A) = %v after Close", got)
		}
	})

	if rec.concurrent.Load() {
		t.Error("onChange ran concurrently with itself")
	}
	t.Logf("ran in %v", time.Since(start).Round(time.Millisecond))
}

// TestND6Reserve: a VM's EUI-64 addresses (link-local and SLAAC) are kept
// for its MAC once reserved: another MAC's claim of them is refused (and a
// binding it made before goes), the owner's is taken; released, they are
// first come first served again.
func TestND6Reserve(t *testing.T) {
	l, err := newTable(netip.MustParsePrefix("fd00:1:2:3::/64"), time.Minute, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	owner, thief := nd6MAC("52:55:55:c6:0d:45"), nd6MAC("52:55:55:00:00:66")
	ll, slaac := nd6IP("fe80::5055:55ff:fec6:d45"), nd6IP("fd00:1:2:3:5055:55ff:fec6:d45")
	now := time.Now()
	l.Claim([6]byte(thief), ll, now) // before the reservation: first come
	l.Reserve(owner, true)
	for _, ip := range []netip.Addr{ll, slaac} {
		l.Claim([6]byte(thief), ip, now)
		if o, ok := l.Owner(ip); ok {
			t.Errorf("%s is bound to %s after its owner's reservation", ip, o)
		}
		l.Claim([6]byte(owner), ip, now)
		if o, ok := l.Owner(ip); !ok || o.String() != owner.String() {
			t.Errorf("%s: owner %v %v, want %s", ip, o, ok, owner)
		}
	}
	l.Reserve(owner, false)
	l.Forget(owner)
	l.Claim([6]byte(thief), ll, now)
	if o, ok := l.Owner(ll); !ok || o.String() != thief.String() {
		t.Errorf("released: %s owner %v %v, want %s", ll, o, ok, thief)
	}
}

// TestND6Version: the learner's version moves with every change of what
// Reserved and Bindings return (a binding made, replaced, forgotten or
// expired, a reservation made or let go), and only then: a binding's
// claim renewed, a claim refused and a reservation made again change
// nothing (the IPv6 guard's Sync then reuses what it worked out).
func TestND6Version(t *testing.T) {
	l, err := newTable(netip.MustParsePrefix("fd00:1:2:3::/64"), time.Minute, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	owner, other := nd6MAC("52:55:55:c6:0d:45"), nd6MAC("52:55:55:00:00:66")
	ip, ll := nd6IP("fd00:1:2:3::77"), nd6IP("fe80::5055:55ff:fec6:d45")
	now := time.Now()
	for _, step := range []struct {
		what  string
		do    func()
		moves bool
	}{
		{"a binding made", func() { l.Claim([6]byte(owner), ip, now) }, true},
		{"its claim renewed", func() { l.Claim([6]byte(owner), ip, now.Add(time.Second)) }, false},
		{"another MAC's claim refused", func() { l.Claim([6]byte(other), ip, now.Add(time.Second)) }, false},
		{"another MAC's binding of an EUI-64 address", func() { l.Claim([6]byte(other), ll, now) }, true},
		{"a reservation made, displacing it", func() { l.Reserve(owner, true) }, true},
		{"made again", func() { l.Reserve(owner, true) }, false},
		{"another MAC's claim of it refused", func() { l.Claim([6]byte(other), ll, now) }, false},
		{"the reservation let go", func() { l.Reserve(owner, false) }, true},
		{"the binding forgotten", func() { l.Forget(owner) }, true},
		{"forgotten again", func() { l.Forget(owner) }, false},
		{"another binding made", func() { l.Claim([6]byte(other), ip, now) }, true},
		{"and expired", func() { l.expire(now.Add(time.Hour)) }, true},
	} {
		before := l.Version()
		step.do()
		if moved := l.Version() != before; moved != step.moves {
			t.Errorf("%s: the version moved: %v, want %v", step.what, moved, step.moves)
		}
	}
}
