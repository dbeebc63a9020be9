package controller_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/test/simvm"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// The IPv6 world of TestIPv6: the host's uplink and a WAN peer on a
// documentation prefix, inside the test's namespaces only. The WAN has no
// route to the networks' prefixes: a reply comes back only through NAT66.
const (
	ipv6Networks = `
vmnet:
  shared:
    subnet: 10.77.0.0/24
    subnet6: fd00:77::/64
  host:
    mode: host
    subnet: 10.78.0.0/24
    subnet6: fd00:78::/64
  nora:
    mode: host
    subnet: 10.79.0.0/24
    routerAdvertisement: false
  iso:
    subnet: 10.80.0.0/24
    subnet6: fd00:80::/64
    isolation: true
  v4only:
    subnet: 10.81.0.0/24
    ipv6: false
`
	ipv6VMs = `
vms:
  a:
    networks:
      - vmnet: shared
  b:
    networks:
      - vmnet: shared
  x:
    networks:
      - vmnet: shared
  c:
    networks:
      - vmnet: host
  d:
    networks:
      - vmnet: nora
  i1:
    networks:
      - vmnet: iso
  i2:
    networks:
      - vmnet: iso
  e1:
    networks:
      - vmnet: v4only
  e2:
    networks:
      - vmnet: v4only
`
	wan6Host = "2001:db8:100::1"
	wan6Peer = "2001:db8:100::2"
)

// TestIPv6: VMs get addresses by SLAAC from the networks' router
// advertisements and reach their gateway over IPv6 (DNS too); on a shared
// network the default route leads to a WAN through NAT66; on a host-only
// network there is no default route, and one added by hand leads nowhere;
// with routerAdvertisement: false there is no address.
func TestIPv6(t *testing.T) {
	h := &host{Host: simvm.NewHost(t, "vmn6", ipv6Networks, "pgrep"), t: t}
	wan := testutil.NewNS(t, "wan6")
	testutil.Run(t, "ip", "-n", h.Name, "link", "add", "uplink", "type", "veth", "peer", "name", "eth0", "netns", wan.Name)
	h.MustRun(t, "ip", "addr", "add", wan6Host+"/64", "dev", "uplink", "nodad")
	h.MustRun(t, "ip", "link", "set", "uplink", "up")
	h.MustRun(t, "ip", "-6", "route", "add", "default", "via", wan6Peer)
	wan.MustRun(t, "ip", "addr", "add", wan6Peer+"/64", "dev", "eth0", "nodad")
	wan.MustRun(t, "ip", "link", "set", "eth0", "up")

	h.MustVmnetctl("up", "-f", h.WriteFile("vms.yaml", ipv6VMs))
	st := h.Status()
	a, c, d := h.VM(h.Attachment(st, "a")), h.VM(h.Attachment(st, "c")), h.VM(h.Attachment(st, "d"))
	bAtt, xAtt := h.Attachment(st, "b"), h.Attachment(st, "x")
	b, x := h.VM(bAtt), h.VM(xAtt)
	lease := a.DHCP(t)
	a6 := slaacAddress(t, a, "fd00:77::/64")
	b6 := slaacAddress(t, b, "fd00:77::/64")
	slaacAddress(t, x, "fd00:77::/64")
	slaacAddress(t, c, "fd00:78::/64")

	if err := a.Ping("fd00:77::1", 1); err != nil {
		t.Errorf("a cannot reach its IPv6 gateway: %v", err)
	}
	if out, _ := a.Run(context.Background(), "ip", "-6", "route", "show", "default"); !strings.Contains(out, "via fe80:") {
		t.Errorf("a has no default route from the router advertisement: %q", out)
	}
	if err := a.Ping(wan6Peer, 1); err != nil {
		t.Errorf("a does not reach the WAN through NAT66: %v", err)
	}
	out, err := a.Run(context.Background(), "busybox", "nslookup", "a.vmnet.internal", "fd00:77::1")
	if err != nil || !strings.Contains(out, lease["ip"]) {
		t.Errorf("DNS over IPv6 from a: %v\n%s", err, out)
	}

	// status --json shows the IPv6 side: prefixes, NAT66, a VM's addresses.
	testutil.Eventually(t, 10*time.Second, func() error {
		st := h.Status()
		if got := h.Attachment(st, "a").IPv6; !slices.Contains(got, a6.String()) {
			return fmt.Errorf("a's IPv6 in status: %v, want %s among them", got, a6)
		}
		for _, n := range st.Networks {
			want := map[string]string{"shared": "fd00:77::/64 true", "host": "fd00:78::/64 false"}[n.Name]
			if got := fmt.Sprintf("%s %v", n.Subnet6, n.NAT66); want != "" && got != want {
				return fmt.Errorf("network %s: subnet6 and nat66 %q, want %q", n.Name, got, want)
			}
		}
		return nil
	}, "status to show the IPv6 side")

	// AAAA: a VM's name gives the addresses the network learned it uses.
	testutil.Eventually(t, 10*time.Second, func() error {
		out, _ := a.Run(context.Background(), "busybox", "nslookup", "-type=AAAA", "b.vmnet.internal", "fd00:77::1")
		if !strings.Contains(out, b6.String()) {
			return fmt.Errorf("AAAA of b from a: %s", out)
		}
		return nil
	}, "b's AAAA record")

	// x takes b's address (no duplicate detection, as a hostile guest
	// would) and sends from it: dropped. It advertises b's address as its
	// own (an unsolicited override NA from its own MAC and link-local
	// address, which are x's): dropped; the host still reaches b at b's
	// MAC.
	x.MustRun(t, "ip", "-6", "addr", "add", b6.String()+"/64", "dev", "eth0", "nodad")
	if _, err := x.Run(context.Background(), "ping", "-n", "-c", "1", "-W", "2", "-I", b6.String(), "fd00:77::1"); err == nil {
		t.Errorf("x reached the gateway from b's address %s", b6)
	}
	x.MustRun(t, "ip", "-6", "addr", "del", b6.String()+"/64", "dev", "eth0")
	h.MustRun(t, "ping", "-c", "1", "-W", "2", b6.String()) // the host has a neighbour entry for b
	xLL := strings.Fields(x.MustRun(t, "ip", "-6", "-o", "addr", "show", "dev", "eth0", "scope", "link"))
	if len(xLL) < 4 {
		t.Fatalf("x has no link-local address: %q", xLL)
	}
	sendForgedNA(t, x, mustParseMAC(t, xAtt.MAC), netip.MustParsePrefix(xLL[3]).Addr(), b6)
	// The NA went out before this ping: had the host taken it, the entry
	// would now be x's MAC.
	x.MustRun(t, "ping", "-c", "1", "-W", "2", "fd00:77::1")
	if out := h.MustRun(t, "ip", "-6", "neigh", "show", b6.String()); !strings.Contains(out, strings.ToLower(bAtt.MAC)) {
		t.Errorf("the host's neighbour entry for b's %s is %q, want b's MAC %s", b6, out, bAtt.MAC)
	}
	// Nor the gateway's: a VM that has it keeps the bridge's MAC for it.
	sendForgedNA(t, x, mustParseMAC(t, xAtt.MAC), netip.MustParsePrefix(xLL[3]).Addr(), netip.MustParseAddr("fd00:77::1"))
	x.MustRun(t, "ping", "-c", "1", "-W", "2", "fd00:77::1") // after the NA, as above
	if out := b.MustRun(t, "ip", "-6", "neigh", "show", "fd00:77::1"); !strings.Contains(out, hostnet.BridgeMAC("shared").String()) {
		t.Errorf("b's neighbour entry for the gateway is %q, want the bridge's MAC %s", out, hostnet.BridgeMAC("shared"))
	}
	if err := b.Ping("fd00:77::1", 1); err != nil {
		t.Errorf("b cannot reach the gateway after x's forgery: %v", err)
	}
	if drops := h.Attachment(h.Status(), "x").SpoofDrops; drops == 0 {
		t.Errorf("x's spoofed frames were not counted as dropped")
	}

	if err := c.Ping("fd00:78::1", 1); err != nil {
		t.Errorf("c cannot reach its IPv6 gateway on the host network: %v", err)
	}
	if out, _ := c.Run(context.Background(), "ip", "-6", "route", "show", "default"); strings.TrimSpace(out) != "" {
		t.Errorf("c on a host network has a default route: %q", out)
	}
	c.MustRun(t, "ip", "-6", "route", "add", "default", "via", "fd00:78::1")
	if err := c.Ping(wan6Peer, 1); err == nil {
		t.Errorf("c on a host network reached the WAN over IPv6")
	}

	// Isolation holds for IPv6: isolated VMs reach the gateway, not each
	// other (at layer 2 the bridge keeps them apart; through the gateway
	// the forward rules do).
	i1, i2 := h.VM(h.Attachment(st, "i1")), h.VM(h.Attachment(st, "i2"))
	slaacAddress(t, i1, "fd00:80::/64")
	i26 := slaacAddress(t, i2, "fd00:80::/64")
	if err := i1.Ping("fd00:80::1", 1); err != nil {
		t.Errorf("i1 cannot reach its IPv6 gateway: %v", err)
	}
	if err := i1.Ping(i26.String(), 1); err == nil {
		t.Errorf("isolated i1 reached i2 over IPv6")
	}

	// ipv6: false means no IPv6 between VMs either, link-local included
	// (while IPv4 works).
	e1, e2 := h.VM(h.Attachment(st, "e1")), h.VM(h.Attachment(st, "e2"))
	le2 := e2.DHCP(t)
	e1.DHCP(t)
	if err := e1.Ping(le2["ip"], 1); err != nil {
		t.Errorf("IPv4 between e1 and e2 on the IPv4-only network: %v", err)
	}
	linkLocalOf(t, e1)
	if err := e1.Ping(linkLocalOf(t, e2).String()+"%eth0", 1); err == nil {
		t.Errorf("e1 reached e2 over IPv6 on a network with ipv6: false")
	}

	// By now a and c have had their advertisements; d, on a network
	// without them, has no address in any prefix.
	if out, _ := d.Run(context.Background(), "ip", "-6", "-o", "addr", "show", "dev", "eth0", "scope", "global"); strings.TrimSpace(out) != "" {
		t.Errorf("d on a network with routerAdvertisement: false has %q", out)
	}
	t.Logf("a's address: %s", a6)
}

// slaacAddress waits for vm's eth0 to have a global address in prefix
// (SLAAC from the network's router advertisements) and returns it.
func slaacAddress(t *testing.T, vm *simvm.VM, prefix string) netip.Addr {
	t.Helper()
	p := netip.MustParsePrefix(prefix)
	var got netip.Addr
	testutil.Eventually(t, 30*time.Second, func() error {
		out, err := vm.Run(context.Background(), "ip", "-6", "-o", "addr", "show", "dev", "eth0", "scope", "global")
		if err != nil {
			return err
		}
		for _, f := range strings.Fields(out) {
			if pf, err := netip.ParsePrefix(f); err == nil && p.Contains(pf.Addr()) && !strings.Contains(out, "tentative") {
				got = pf.Addr()
				return nil
			}
		}
		dbg, _ := vm.Run(context.Background(), "sh", "-c", "nstat -az | grep -E 'Icmp6(In|Out)(RouterSolicits|RouterAdvertisements|NeighborSolicits)'; ip -6 addr; ip link show eth0")
		return fmt.Errorf("%s has no address in %s: %q\n%s", vm.Name, prefix, out, dbg)
	}, "a SLAAC address")
	return got
}

func mustParseMAC(t *testing.T, s string) net.HardwareAddr {
	t.Helper()
	mac, err := net.ParseMAC(s)
	if err != nil {
		t.Fatal(err)
	}
	return mac
}

// sendForgedNA writes, on vm's eth0, an unsolicited neighbour
// advertisement (override flag set) from vm's MAC and address src to all
// nodes saying that target is at vm's MAC: what a guest that wants
// another's traffic sends.
func sendForgedNA(t *testing.T, vm *simvm.VM, mac net.HardwareAddr, src, target netip.Addr) {
	t.Helper()
	dst := netip.MustParseAddr("ff02::1")
	icmp := make([]byte, 32)
	icmp[0] = 136                      // neighbour advertisement
	icmp[4] = 0x20                     // override
	copy(icmp[8:24], target.AsSlice()) // target
	icmp[24], icmp[25] = 2, 1          // target link-layer address option
	copy(icmp[26:32], mac)
	// Checksum over the IPv6 pseudo-header and the message.
	var sum uint32
	pseudo := append(append(append([]byte{}, src.AsSlice()...), dst.AsSlice()...), 0, 0, 0, byte(len(icmp)), 0, 0, 0, 58)
	for _, b := range [][]byte{pseudo, icmp} {
		for i := 0; i+1 < len(b); i += 2 {
			sum += uint32(b[i])<<8 | uint32(b[i+1])
		}
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	cs := ^uint16(sum)
	icmp[2], icmp[3] = byte(cs>>8), byte(cs)
	ip6 := make([]byte, 40)
	ip6[0] = 0x60
	ip6[5] = byte(len(icmp))
	ip6[6], ip6[7] = 58, 255
	copy(ip6[8:24], src.AsSlice())
	copy(ip6[24:40], dst.AsSlice())
	frame := append(append([]byte{0x33, 0x33, 0, 0, 0, 1}, mac...), 0x86, 0xdd)
	frame = append(append(frame, ip6...), icmp...)
	err := vm.Do(func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		return unix.Sendto(fd, frame, 0, &unix.SockaddrLinklayer{Ifindex: ifi.Index, Halen: 6})
	})
	if err != nil {
		t.Fatalf("sending a forged neighbour advertisement from %s: %v", vm.Name, err)
	}
}

// TestIPv6OffOnHost: on a host that leaves IPv6 off on new interfaces
// (net.ipv6.conf.default.disable_ipv6=1), networks come up without it, and
// IPv4 works; the controller says why.
func TestIPv6OffOnHost(t *testing.T) {
	h := &host{Host: simvm.NewHost(t, "vmn6off", ipv6Networks, "pgrep"), t: t}
	h.MustRun(t, "sysctl", "-q", "-w", "net.ipv6.conf.default.disable_ipv6=1")
	h.MustVmnetctl("up", "-f", h.WriteFile("vms.yaml", "vms:\n  a:\n    networks:\n      - vmnet: shared\n"))
	st := h.Status()
	for _, n := range st.Networks {
		if n.State != "up" {
			t.Errorf("network %s: %s %s, want up", n.Name, n.State, n.Error)
		}
	}
	a := h.VM(h.Attachment(st, "a"))
	a.DHCP(t)
	if err := a.Ping("10.77.0.1", 1); err != nil {
		t.Errorf("IPv4 does not work on a host without IPv6: %v", err)
	}
	if out := h.MustRun(t, "ip", "-6", "addr", "show", "dev", "vmn-shared"); strings.TrimSpace(out) != "" {
		t.Errorf("vmn-shared has IPv6 addresses on a host without IPv6: %s", out)
	}
	testutil.Eventually(t, 10*time.Second, func() error {
		log, _ := os.ReadFile(filepath.Join(h.StateDir(), "controller.log"))
		if !strings.Contains(string(log), "IPv6 is off on this host") {
			return fmt.Errorf("the controller's log does not say IPv6 is off")
		}
		return nil
	}, "the controller to warn that IPv6 is off")
}

// linkLocalOf waits for vm's eth0 to have its link-local address, past
// duplicate address detection, and returns it.
func linkLocalOf(t *testing.T, vm *simvm.VM) netip.Addr {
	t.Helper()
	var ll netip.Addr
	testutil.Eventually(t, 10*time.Second, func() error {
		out, err := vm.Run(context.Background(), "ip", "-6", "-o", "addr", "show", "dev", "eth0", "scope", "link")
		f := strings.Fields(out)
		if err != nil || len(f) < 4 || strings.Contains(out, "tentative") {
			return fmt.Errorf("%s's link-local address: %q %v", vm.Name, out, err)
		}
		ll = netip.MustParsePrefix(f[3]).Addr()
		return nil
	}, "a link-local address")
	return ll
}
