// Package hostile attacks vmnetctl's networks from inside: a VM that writes
// raw Ethernet frames on its own helper socket tries to take the network
// away from a victim VM beside it, on a shared and on an isolated host
// network (issue 22, docs/security.md).
package hostile

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/miekg/dns"

	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/dnsproxy"
	"github.com/vmnetctl/vmnetctl/test/simvm"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

func TestMain(m *testing.M) { simvm.Main(m) }

// Narrow DHCP pools, so that exhaustion would show at once.
const networksYAML = `
vmnet:
  shared:
    subnet: 10.81.0.0/24
    dhcpRange: {start: 10.81.0.100, end: 10.81.0.120}
  isolated:
    mode: host
    subnet: 10.82.0.0/24
    isolation: true
    dhcpRange: {start: 10.82.0.100, end: 10.82.0.120}
`

// The attacker's MAC is pinned by the VM file on shared; on isolated the
// guard keeps the first MAC it sends from.
const vmsYAML = `
vms:
  victim:
    networks: [{vmnet: shared}, {vmnet: isolated}]
  attacker:
    networks:
      - vmnet: shared
        macAddress: "52:55:55:aa:00:01"
      - vmnet: isolated
  newcomer:
    networks: [{vmnet: shared}, {vmnet: isolated}]
  tapper:
    networks: [{vmnet: shared, attach: tap}]
  bridger:
    networks: [{vmnet: shared, spoofCheck: false}]
`

func TestHostileGuest(t *testing.T) {
	h := simvm.NewHost(t, "vmnh", networksYAML, "bridge")
	vms := h.WriteFile("vms.yaml", vmsYAML)
	h.MustVmnetctl("up", "-f", vms)
	st := h.Status()
	out := outsider(t, h)
	for _, tc := range []struct{ network, gateway, first, last string }{
		{"shared", "10.81.0.1", "10.81.0.100", "10.81.0.120"},
		{"isolated", "10.82.0.1", "10.82.0.100", "10.82.0.120"},
	} {
		t.Run(tc.network, func(t *testing.T) {
			t.Parallel()
			s := &scene{t: t, h: h, st: st, out: out, network: tc.network, gateway: netip.MustParseAddr(tc.gateway), first: tc.first, last: tc.last}
			for _, n := range st.Networks {
				if n.Name == tc.network {
					s.prefix6, s.gateway6 = netip.MustParsePrefix(n.Subnet6), netip.MustParseAddr(n.Gateway6)
				}
			}
			s.attack()
		})
	}
	t.Run("tap", func(t *testing.T) {
		t.Parallel()
		tapAttack(t, h, st)
	})
	t.Run("optout", func(t *testing.T) {
		t.Parallel()
		optOut(t, h, st)
	})
}

// optOut: an attachment with `spoofCheck: false` (a VM that bridges
// containers of its own) sends from MACs and addresses other than its own,
// and nothing is dropped.
func optOut(t *testing.T, h *simvm.Host, st *ctlapi.Status) {
	ba := h.Attachment(st, "bridger")
	b := newAttacker(t, mustMAC(ba.MAC), ba.Socket, filepath.Join(h.Dir, "bridger.sock"))
	gw := netip.MustParseAddr("10.81.0.1")
	zero := net.HardwareAddr{0, 0, 0, 0, 0, 0}
	const n = 8
	testutil.Eventually(t, 10*time.Second, func() error {
		for i := range n {
			c := containerMAC(i)
			b.send(ether(broadcastMAC, c, etherARP, arp(1, c, netip.MustParseAddr(fmt.Sprintf("10.81.0.%d", 200+i)), zero, gw)))
		}
		out := h.MustRun(t, "bridge", "fdb", "show", "dev", ba.Tap)
		for i := range n {
			if !strings.Contains(out, containerMAC(i).String()) {
				return fmt.Errorf("the bridge has not learned %s on %s:\n%s", containerMAC(i), ba.Tap, out)
			}
		}
		return nil
	}, "the containers' MACs on the opted-out port")
	for _, a := range h.Status().Attachments {
		if a.VM == "bridger" && a.SpoofDrops != 0 {
			t.Errorf("bridger (spoofCheck: false): %d frames dropped, want 0", a.SpoofDrops)
		}
	}
}

// tapAttack: a VM whose VMM writes into its TAP itself is guarded the same
// way: the first MAC it sends from is its own, others are dropped before
// the bridge learns them.
func tapAttack(t *testing.T, h *simvm.Host, st *ctlapi.Status) {
	var ta ctlapi.AttachmentStatus
	for _, a := range st.Attachments {
		if a.VM == "tapper" {
			ta = a
		}
	}
	write := tapWriter(t, h.NS, ta.Tap)
	own := mustMAC(ta.MAC)
	gw := netip.MustParseAddr("10.81.0.1")
	zero := net.HardwareAddr{0, 0, 0, 0, 0, 0}
	// Its own MAC first (an address probe): that MAC is the port's now.
	// The bridge takes frames from the port only once it has seen the
	// TAP's carrier come up (when the TAP was opened, in its own time):
	// probe until it has learned the MAC.
	testutil.Eventually(t, 10*time.Second, func() error {
		write(ether(broadcastMAC, own, etherARP, arp(1, own, netip.IPv4Unspecified(), zero, gw)))
		if out := h.MustRun(t, "bridge", "fdb", "show", "dev", ta.Tap); !strings.Contains(out, own.String()) {
			return fmt.Errorf("the bridge has not learned %s on %s yet", own, ta.Tap)
		}
		return nil
	}, "the TAP's port to forward")
	spoofed := 0
	for i := range 50 {
		write(ether(broadcastMAC, randomMAC(1000+i), etherARP, arp(1, randomMAC(1000+i), netip.IPv4Unspecified(), zero, gw)))
		spoofed++
	}
	for range 5 {
		write(ether(broadcastMAC, own, etherARP, arp(2, own, gw, broadcastMAC, gw))) // "the gateway is at me"
		write(ether(broadcastMAC, own, etherIPv4, icmpEcho(netip.MustParseAddr("10.81.0.9"), gw)))
		spoofed += 2
	}
	testutil.Eventually(t, 10*time.Second, func() error {
		for _, a := range h.Status().Attachments {
			if a.VM == "tapper" && a.SpoofDrops < uint64(spoofed) {
				return fmt.Errorf("tapper: %d frames dropped, want at least %d", a.SpoofDrops, spoofed)
			}
		}
		return nil
	}, "the TAP attachment's drop counter")
	out := h.MustRun(t, "bridge", "fdb", "show", "dev", ta.Tap)
	if strings.Contains(out, "02:ba:d0:") {
		t.Errorf("the bridge learned made-up MACs on %s:\n%s", ta.Tap, out)
	}
	if !strings.Contains(out, own.String()) {
		t.Errorf("the bridge did not learn the tapper's own MAC %s on %s:\n%s", own, ta.Tap, out)
	}
	if out := h.MustRun(t, "ip", "neigh", "show", "10.81.0.9"); strings.TrimSpace(out) != "" {
		t.Errorf("host: a neighbour entry for 10.81.0.9, which nobody leased: %s", out)
	}
}

// containerMAC is the MAC of a container inside the opted-out VM (not a
// randomMAC: the scenes look for those in the bridge).
func containerMAC(i int) net.HardwareAddr { return net.HardwareAddr{0x02, 0xc0, 0, 0, 0, byte(i)} }

// scene is one network under attack.
type scene struct {
	t           *testing.T
	h           *simvm.Host
	st          *ctlapi.Status
	out         *testutil.NS // a LAN neighbour of the host, outside the bridges
	network     string
	gateway     netip.Addr
	first, last string // the DHCP pool
	prefix6     netip.Prefix
	gateway6    netip.Addr
}

func (s *scene) attachment(vm string) ctlapi.AttachmentStatus {
	for _, a := range s.st.Attachments {
		if a.VM == vm && a.Network == s.network {
			return a
		}
	}
	s.t.Fatalf("no attachment of %s to %s in %+v", vm, s.network, s.st.Attachments)
	return ctlapi.AttachmentStatus{}
}

func (s *scene) bridge() string {
	for _, n := range s.st.Networks {
		if n.Name == s.network {
			return n.Bridge
		}
	}
	s.t.Fatalf("no network %s", s.network)
	return ""
}

// vm attaches a simulated VM (a namespace with a real stack) to vm's helper.
func (s *scene) vm(vm string) *simvm.VM {
	a := s.attachment(vm)
	return simvm.AttachSocket(s.t, fmt.Sprintf("%.3s-%.3s", vm, s.network), a.MAC, a.Socket,
		filepath.Join(s.h.Dir, fmt.Sprintf("%s.%s.client.sock", vm, s.network)))
}

// spoofFill fills the payload of the TCP segments the attacker sends from
// addresses not its own, so that the victim's capture can tell it in any
// frame.
const spoofFill = 0xee

func (s *scene) attack() {
	t := s.t
	br := s.bridge()
	bridgeMAC := mustMAC(strings.TrimSpace(s.h.MustRun(t, "cat", "/sys/class/net/"+br+"/address")))

	// The victim leases an address and reaches the gateway.
	va := s.attachment("victim")
	victim := s.vm("victim")
	vmac := mustMAC(va.MAC)
	vip := netip.MustParseAddr(victim.DHCP(t)["ip"])
	if err := victim.Ping(s.gateway.String(), 1); err != nil {
		t.Fatalf("victim cannot reach the gateway: %v", err)
	}
	// Everything that reaches the victim from now on.
	seen := startCapture(t, victim.NS, "eth0")

	// The attacker leases its own address the proper way.
	aa := s.attachment("attacker")
	a := newAttacker(t, mustMAC(aa.MAC), aa.Socket, filepath.Join(s.h.Dir, "attacker."+s.network+".sock"))
	aip := a.lease()
	spoofed := 0 // frames the guard must drop
	bcast := netip.MustParseAddr("255.255.255.255")

	// Replies that echo what the attacker chose (its client identifier),
	// asked for as broadcasts and from a port of its choice: the server
	// answers the attacker alone, on its port 68, so none reaches the
	// victim (checked at the end), on an isolated network neither.
	marker := []byte("the attacker's own bytes, echoed")
	disc, _ := dhcpv4.NewDiscovery(a.mac, dhcpv4.WithBroadcast(true), dhcpv4.WithOption(dhcpv4.OptClientIdentifier(marker)))
	if off := a.dhcp(a.mac, disc); off == nil || !bytes.Contains(off.ToBytes(), marker) {
		t.Errorf("attacker's broadcast DISCOVER with a client identifier: reply %v, want an OFFER that echoes it", off)
	}
	inform, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeInform), dhcpv4.WithHwAddr(a.mac),
		dhcpv4.WithBroadcast(true), dhcpv4.WithClientIP(net.IP(aip.AsSlice())), dhcpv4.WithOption(dhcpv4.OptClientIdentifier(marker)))
	a.send(ether(bridgeMAC, a.mac, etherIPv4, ipv4UDP(aip, s.gateway, 9999, 67, inform.ToBytes())))

	// DHCP exhaustion: requests for every address of the subnet, for
	// client addresses that are not the attacker's, sent from its own MAC
	// (the DHCP server ignores them, past its burst unread: its rate
	// limit) and from those MACs (the guard drops them).
	for i, ip := 0, netip.MustParseAddr(s.first).Prev(); i < 254; i, ip = i+1, ip.Next() {
		for _, src := range []net.HardwareAddr{a.mac, randomMAC(i)} {
			req, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), dhcpv4.WithHwAddr(randomMAC(i)),
				dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IP(ip.AsSlice()))),
				dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IP(s.gateway.AsSlice()))))
			a.send(ether(broadcastMAC, src, etherIPv4, ipv4UDP(netip.IPv4Unspecified(), bcast, 68, 67, req.ToBytes())))
		}
		spoofed++
	}
	// DECLINE flood: the attacker declines every address of the pool.
	for ip := netip.MustParseAddr(s.first); ip.Compare(netip.MustParseAddr(s.last)) <= 0; ip = ip.Next() {
		dec, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeDecline), dhcpv4.WithHwAddr(a.mac),
			dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IP(ip.AsSlice()))),
			dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IP(s.gateway.AsSlice()))))
		a.send(ether(broadcastMAC, a.mac, etherIPv4, ipv4UDP(netip.IPv4Unspecified(), bcast, 68, 67, dec.ToBytes())))
	}
	// Spoofing, each frame a few times.
	stranger := netip.MustParseAddr(s.gateway.String()).Next().Next().Next() // .4: nobody's
	offer, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeOffer), dhcpv4.WithHwAddr(vmac),
		dhcpv4.WithYourIP(net.IP(vip.AsSlice())), dhcpv4.WithOption(dhcpv4.OptRouter(net.IP(aip.AsSlice()))))
	ack, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeAck), dhcpv4.WithHwAddr(vmac),
		dhcpv4.WithYourIP(net.IP(vip.AsSlice())), dhcpv4.WithOption(dhcpv4.OptRouter(net.IP(aip.AsSlice()))),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IP(aip.AsSlice()))))
	forged := [][]byte{
		// "The gateway is at the attacker", to the victim.
		ether(vmac, a.mac, etherARP, arp(2, a.mac, s.gateway, vmac, vip)),
		// "The victim is at the attacker", to everyone (the host).
		ether(broadcastMAC, a.mac, etherARP, arp(2, a.mac, vip, broadcastMAC, vip)),
		// The victim's own MAC and address: would move the victim's
		// MAC to the attacker's port in the bridge.
		ether(broadcastMAC, vmac, etherARP, arp(1, vmac, vip, net.HardwareAddr{0, 0, 0, 0, 0, 0}, s.gateway)),
		// The victim's address on the attacker's MAC, to the gateway.
		ether(bridgeMAC, a.mac, etherIPv4, icmpEcho(vip, s.gateway)),
		// An address nobody leased.
		ether(bridgeMAC, a.mac, etherIPv4, icmpEcho(stranger, s.gateway)),
		ether(broadcastMAC, a.mac, etherARP, arp(1, a.mac, stranger, net.HardwareAddr{0, 0, 0, 0, 0, 0}, s.gateway)),
		// A DHCP server of its own.
		ether(broadcastMAC, a.mac, etherIPv4, ipv4UDP(aip, bcast, 67, 68, offer.ToBytes())),
		// The same from its own leased address and another source port
		// (clients look at the destination port only), broadcast and
		// to the victim.
		ether(broadcastMAC, a.mac, etherIPv4, ipv4UDP(aip, bcast, 68, 68, offer.ToBytes())),
		ether(vmac, a.mac, etherIPv4, ipv4UDP(aip, vip, 68, 68, ack.ToBytes())),
		ether(broadcastMAC, a.mac, etherIPv4, ipv4UDP(aip, bcast, 1067, 68, ack.ToBytes())),
		// A router of its own.
		ether(net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}, a.mac, etherIPv6, routerAdvert()),
		// A VLAN tag around a broadcast ARP.
		ether(broadcastMAC, a.mac, etherVLAN, append([]byte{0, 5, 0x08, 0x06}, arp(2, a.mac, s.gateway, broadcastMAC, s.gateway)...)),
	}
	// The same frames in a VLAN 0 tag (a priority tag, which Linux takes
	// as untagged) and in two tags: the guard drops every tagged frame
	// first, whatever it holds (issue 37).
	var tagged [][]byte
	for _, f := range forged {
		for _, tags := range [][]byte{{0x81, 0, 0, 0}, {0x88, 0xa8, 0, 5, 0x81, 0, 0, 0}} {
			tagged = append(tagged, slices.Concat(f[:12], tags, f[12:]))
		}
	}
	for range 3 {
		for _, f := range slices.Concat(forged, tagged) {
			a.send(f)
			spoofed++
		}
	}
	// Runs of TCP segments the attacker's relay merges where a batch
	// brings them together, from the gateway's address and from nobody's
	// to the victim: the guard drops a merged run as one packet, so each
	// run counts at least once. (A run from its own address follows once
	// its address has settled, below.)
	var spoofedRuns [][]byte
	for _, src := range []netip.Addr{s.gateway, stranger} {
		run := tcpRun(vmac, a.mac, src, vip, 0, 20, spoofFill)
		for _, f := range run {
			a.send(f)
		}
		spoofedRuns = append(spoofedRuns, run...)
		spoofed++
	}

	// The victim renews and keeps its address, and still reaches the
	// gateway; a new VM gets an address of the pool.
	if got := victim.DHCP(t)["ip"]; got != vip.String() {
		t.Errorf("victim's renewal got %s, had %s", got, vip)
	}
	if err := victim.Ping(s.gateway.String(), 1); err != nil {
		t.Errorf("victim cannot reach the gateway after the attack: %v", err)
	}
	// The newcomer boots while the attacker releases and requests its
	// own lease in a loop, each a change to the guard that the server
	// would make at once: its rate limit keeps the server for the others.
	// Meanwhile it claims the newcomer's EUI-64 addresses, which are
	// reserved for it (its MAC is known before it boots), and probes ever
	// new addresses of the prefix, each a new binding for the learner if
	// let through.
	req, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), dhcpv4.WithHwAddr(a.mac),
		dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IP(aip.AsSlice()))),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IP(s.gateway.AsSlice()))))
	rel, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeRelease), dhcpv4.WithHwAddr(a.mac),
		dhcpv4.WithClientIP(net.IP(aip.AsSlice())), dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IP(s.gateway.AsSlice()))))
	nmac := mustMAC(s.attachment("newcomer").MAC)
	aLL := eui64(netip.MustParsePrefix("fe80::/64"), a.mac)
	loop := [][]byte{
		ether(broadcastMAC, a.mac, etherIPv4, ipv4UDP(netip.IPv4Unspecified(), bcast, 68, 67, req.ToBytes())),
		ether(broadcastMAC, a.mac, etherIPv4, ipv4UDP(netip.IPv4Unspecified(), bcast, 68, 67, rel.ToBytes())),
		neighborAdvert(a.mac, aLL, eui64(netip.MustParsePrefix("fe80::/64"), nmac)),
		neighborAdvert(a.mac, aLL, eui64(s.prefix6, nmac)),
	}
	stop, flooded := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(flooded)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			for _, f := range loop {
				a.conn.WriteToUnix(f, a.helper) // (t.Fatal is not for goroutines)
			}
			p := s.prefix6.Addr().As16()
			p[8], p[12], p[13], p[14], p[15] = 0x42, byte(i>>24), byte(i>>16), byte(i>>8), byte(i)
			a.conn.WriteToUnix(dadSolicit(a.mac, netip.AddrFrom16(p)), a.helper)
		}
	}()
	newcomer := s.vm("newcomer")
	ip := newcomer.DHCP(t)["ip"]
	if testutil.InRange(ip, s.first, s.last) != nil {
		t.Errorf("newcomer's lease %q is not in the pool %s-%s", ip, s.first, s.last)
	}
	// Its IPv6 addresses are its own: no failed duplicate address
	// detection, and it reaches the gateway from its SLAAC address.
	nglobal := eui64(s.prefix6, nmac)
	testutil.Eventually(t, 20*time.Second, func() error {
		out, err := newcomer.Run(context.Background(), "ip", "-6", "addr", "show", "dev", "eth0")
		switch {
		case err != nil:
			return err
		case strings.Contains(out, "dadfailed"):
			return testutil.Permanent(fmt.Errorf("newcomer: duplicate address detection failed, the attacker's claims got through:\n%s", out))
		case !strings.Contains(out, nglobal.String()+"/64") || strings.Contains(out, "tentative"):
			return fmt.Errorf("newcomer has not got %s yet:\n%s", nglobal, out)
		}
		if _, err := newcomer.Run(context.Background(), "ping", "-6", "-c", "1", "-W", "1", "-I", nglobal.String(), s.gateway6.String()); err != nil {
			return fmt.Errorf("newcomer cannot reach the gateway %s over IPv6: %v", s.gateway6, err)
		}
		return nil
	}, "the newcomer's IPv6 addresses")
	// An address of its own choosing (a privacy or static one, reserved
	// for nobody) is bound by the learner from its probes: the flood of
	// probes does not starve it.
	p := s.prefix6.Addr().As16()
	p[8], p[14], p[15] = 0x5e, 0xed, 0x01
	nstatic := netip.AddrFrom16(p)
	newcomer.NS.MustRun(t, "ip", "-6", "addr", "add", nstatic.String()+"/64", "dev", "eth0")
	testutil.Eventually(t, 20*time.Second, func() error {
		if _, err := newcomer.Run(context.Background(), "ping", "-6", "-c", "1", "-W", "1", "-I", nstatic.String(), s.gateway6.String()); err != nil {
			return fmt.Errorf("newcomer cannot reach the gateway %s from %s: %v", s.gateway6, nstatic, err)
		}
		return nil
	}, "the newcomer's own IPv6 address")
	close(stop)
	<-flooded
	for _, n := range s.h.Status().Networks {
		if n.Name == s.network && n.Leases > 3 {
			t.Errorf("%d leases on %s, want at most 3 (victim, attacker, newcomer)", n.Leases, s.network)
		}
	}
	// The attacker still gets an address for itself (not one it
	// declined, if its DECLINE got through the rate limit: that one is in
	// quarantine).
	if again := a.lease(); testutil.InRange(again.String(), s.first, s.last) != nil {
		t.Errorf("attacker's own lease %s is not in the pool", again)
	}
	now := s.dnsAttacks(a, bridgeMAC, vip) // the attacker's address now
	// A run from the attacker's own address, which the victim must get
	// byte for byte, merged by the attacker's relay and cut again by the
	// victim's; then the same flow on from the gateway's address, which
	// must not ride along in a merged packet under the attacker's header
	// (both checked below).
	ownRun := tcpRun(vmac, a.mac, now, vip, 0, 20, 0)
	for _, f := range append(ownRun, tcpRun(vmac, a.mac, s.gateway, vip, 20, 20, spoofFill)...) {
		a.send(f)
	}

	// The host's neighbour table holds no spoofed entry: the victim's
	// address is at the victim's MAC, the stranger's nowhere.
	var neigh []struct {
		Dst    string `json:"dst"`
		LLAddr string `json:"lladdr"`
	}
	if err := json.Unmarshal([]byte(s.h.MustRun(t, "ip", "-j", "neigh", "show", "dev", br)), &neigh); err != nil {
		t.Fatal(err)
	}
	for _, e := range neigh {
		switch {
		case e.Dst == vip.String() && e.LLAddr != "" && e.LLAddr != vmac.String():
			t.Errorf("host: %s is at %s, the victim is %s", e.Dst, e.LLAddr, vmac)
		case e.Dst == stranger.String():
			t.Errorf("host: a neighbour entry for %s, which nobody leased: %+v", e.Dst, e)
		case e.LLAddr == a.mac.String() && e.Dst != aip.String() && e.Dst != now.String():
			t.Errorf("host: %s is at the attacker's MAC", e.Dst)
		}
	}
	// The bridge learned the victim's MAC on the victim's port only, and
	// none of the attacker's made-up MACs.
	var fdb []struct {
		MAC    string `json:"mac"`
		IfName string `json:"ifname"`
	}
	if err := json.Unmarshal([]byte(s.h.MustRun(t, "bridge", "-j", "fdb", "show", "br", br)), &fdb); err != nil {
		t.Fatal(err)
	}
	for _, e := range fdb {
		switch {
		case e.MAC == vmac.String() && e.IfName != va.Tap:
			t.Errorf("bridge: the victim's MAC %s is on port %s, not the victim's %s", e.MAC, e.IfName, va.Tap)
		case strings.HasPrefix(e.MAC, "02:ba:d0:"):
			t.Errorf("bridge learned the made-up MAC %s on %s", e.MAC, e.IfName)
		}
	}
	// The victim was not told the gateway is the attacker.
	out, err := victim.Run(context.Background(), "ip", "-j", "neigh", "show", s.gateway.String())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, a.mac.String()) {
		t.Errorf("victim: the gateway %s is at the attacker's MAC: %s", s.gateway, out)
	}

	// None of the forged frames reached the victim, which saw the
	// gateway's (the capture works).
	for i, f := range forged {
		if n := seen.seen(f); n > 0 {
			t.Errorf("victim received forged frame %d (%x) %d times", i, f[:min(len(f), 42)], n)
		}
	}
	// A tagged frame would arrive with its tag taken off: what follows
	// the tags, its payload, must not arrive at all.
	for i, f := range forged {
		if n := seen.containing(f[14:]); n > 0 {
			t.Errorf("victim received the payload of forged frame %d (%x), untagged or tagged, %d times", i, f[:min(len(f), 42)], n)
		}
	}
	if n := seen.count(func(f []byte) bool { return bytes.Equal(f[6:12], bridgeMAC) && bytes.Contains(f, marker) }); n > 0 {
		t.Errorf("victim received %d frames from the gateway with the bytes the attacker had the DHCP server echo", n)
	}
	if seen.seenFrom(bridgeMAC) == 0 {
		t.Errorf("victim's capture saw no frame from the gateway %s: it captures nothing", bridgeMAC)
	}
	for i, f := range spoofedRuns {
		if n := seen.seen(f); n > 0 {
			t.Errorf("victim received spoofed TCP segment %d (%x) %d times", i, f[:54], n)
		}
	}
	if n := seen.containing(bytes.Repeat([]byte{spoofFill}, 64)); n > 0 {
		t.Errorf("victim received the payload of spoofed TCP segments in %d frames", n)
	}
	if s.network == "isolated" {
		// Isolation holds for merged runs too (the ping below shows the
		// victim's capture works).
		if n := seen.seenFrom(a.mac); n > 0 {
			t.Errorf("isolated: the victim received %d frames from the attacker", n)
		}
	} else {
		// Sent again until all are seen: the capture may miss a frame
		// in the floods above; a merge that loses or changes a segment
		// never gets there.
		testutil.Eventually(t, 10*time.Second, func() error {
			var got []int
			for _, f := range ownRun {
				got = append(got, seen.seen(f))
			}
			if slices.Contains(got, 0) {
				for _, f := range ownRun {
					a.send(f)
				}
				return fmt.Errorf("the victim has not received each of the attacker's own TCP segments as sent (how often each: %v)", got)
			}
			return nil
		}, "the attacker's own TCP segments at the victim")
	}

	// The guard counted every dropped frame against the attacker, and
	// nothing against the victim.
	testutil.Eventually(t, 10*time.Second, func() error {
		st := s.h.Status()
		for _, x := range st.Attachments {
			switch {
			case x.Network != s.network:
			case x.VM == "attacker" && x.SpoofDrops < uint64(spoofed):
				return fmt.Errorf("attacker: %d frames dropped, want at least %d", x.SpoofDrops, spoofed)
			case x.VM == "victim" && x.SpoofDrops != 0:
				return testutil.Permanent(fmt.Errorf("victim: %d frames dropped, want 0", x.SpoofDrops))
			}
		}
		return nil
	}, "the guard's drop counters")
	// So do the metrics, and the DHCP server counted the requests for
	// other MACs sent from the attacker's own.
	testutil.Eventually(t, 10*time.Second, func() error {
		body, err := s.metrics()
		if err != nil {
			return err
		}
		if v := metric(body, "vmnetctl_attachment_spoofed_frames_total", `network="`+s.network+`"`, `vm="attacker"`); v < float64(spoofed) {
			return fmt.Errorf("vmnetctl_attachment_spoofed_frames_total of the attacker on %s is %v, want at least %d", s.network, v, spoofed)
		}
		// (Not all 254: a burst may overflow the server's socket.)
		if v := metric(body, "vmnetctl_network_dhcp_spoofed_total", `network="`+s.network+`"`); v < 1 {
			return fmt.Errorf("vmnetctl_network_dhcp_spoofed_total of %s is %v, want more than 0", s.network, v)
		}
		if v := metric(body, "vmnetctl_network_dhcp_limited_total", `network="`+s.network+`"`); v < 1 {
			return fmt.Errorf("vmnetctl_network_dhcp_limited_total of %s is %v, want more than 0 after the floods", s.network, v)
		}
		return nil
	}, "the metrics")

}

// metrics scrapes the controller's metrics (its default address, in the
// host's namespace).
func (s *scene) metrics() (string, error) {
	resp, err := s.h.HTTPClient().Get("http://127.0.0.1:9464/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// metric returns the value of the first sample of name whose labels hold
// every one of labels, or -1.
func metric(body, name string, labels ...string) float64 {
	for _, line := range strings.Split(body, "\n") {
		rest, ok := strings.CutPrefix(line, name+"{")
		if !ok {
			continue
		}
		ls, val, ok := strings.Cut(rest, "} ")
		if !ok || slices.ContainsFunc(labels, func(l string) bool { return !strings.Contains(ls, l) }) {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err == nil {
			return v
		}
	}
	return -1
}

// outsider is a namespace beside the host, on a link of its own with a
// route to every address of the host: a LAN neighbour.
func outsider(t *testing.T, h *simvm.Host) *testutil.NS {
	o := testutil.NewNS(t, "vmnho")
	h.MustRun(t, "ip", "link", "add", "lan0", "type", "veth", "peer", "name", "eth0", "netns", o.Name)
	h.MustRun(t, "ip", "addr", "add", "192.168.250.1/30", "dev", "lan0")
	h.MustRun(t, "ip", "link", "set", "lan0", "up")
	o.MustRun(t, "ip", "addr", "add", "192.168.250.2/30", "dev", "eth0")
	o.MustRun(t, "ip", "link", "set", "eth0", "up")
	o.MustRun(t, "ip", "route", "add", "default", "via", "192.168.250.1")
	return o
}

// dnsAttacks: the attacker sends the victim's name as its DHCP host name,
// which leaves the name the victim's; on a host-only network a name from
// outside is refused, not forwarded; and a LAN neighbour that reaches the
// gateway's address gets no answer from the proxy.
// It returns the address the attacker leased for that.
func (s *scene) dnsAttacks(a *attacker, gwMAC net.HardwareAddr, vip netip.Addr) netip.Addr {
	t := s.t
	a.hostname = "victim"
	aip := a.lease()
	r := a.query(gwMAC, aip, s.gateway, "victim."+dnsproxy.Domain)
	var got []string
	if r != nil {
		for _, rr := range r.Answer {
			if x, ok := rr.(*dns.A); ok {
				got = append(got, x.A.String())
			}
		}
	}
	if r == nil || !slices.Equal(got, []string{vip.String()}) {
		t.Errorf("victim.%s after the attacker's DHCP host name \"victim\": %v (%v), want the victim's %s", dnsproxy.Domain, got, r, vip)
	}
	if s.network == "isolated" {
		if r := a.query(gwMAC, aip, s.gateway, "example.com"); r == nil || r.Rcode != dns.RcodeRefused {
			t.Errorf("example.com from a VM of a host-only network: %v, want REFUSED", r)
		}
	}
	if err := s.out.Ping(s.gateway.String(), 1); err != nil {
		t.Fatalf("the LAN neighbour does not reach the gateway's address %s: %v", s.gateway, err)
	}
	q := new(dns.Msg)
	q.SetQuestion("victim."+dnsproxy.Domain+".", dns.TypeA)
	err := s.out.Do(func() error {
		r, _, err := (&dns.Client{Timeout: time.Second}).Exchange(q, net.JoinHostPort(s.gateway.String(), "53"))
		if err == nil {
			return fmt.Errorf("answered: %v", r)
		}
		return nil
	})
	if err != nil {
		t.Errorf("a query from outside the bridge to %s: %v", s.gateway, err)
	}
	return aip
}
