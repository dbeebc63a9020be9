package netplane

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/guard"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/nettypes"
	"github.com/vmnetctl/vmnetctl/overlay/overlaytest"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// vxlanHost is one host of the lab: its namespace, its WAN, its network.
type vxlanHost struct {
	ns  *testutil.NS
	wan *testutil.NS
	nw  *Network
	vm  *testutil.NS
	ip  netip.Addr // its VM's lease
}

// TestVXLAN: three hosts (namespaces joined by an underlay bridge) run the
// same network across them. A VM on each gets a lease from its own host's
// slice of the range, and from no other host (DHCP stays on each side of
// the tunnel); the VMs reach each other by IP, with TCP and with full-size
// frames (the network's MTU is the tunnel's); each reaches the WAN through
// its own host's NAT; no host's bridge learns the gateway's MAC from the
// tunnel (each answers for it itself) and the tunnel guard counts what it
// dropped. One host leaving keeps the others connected, and when it joins
// again its VM is reached again.
func TestVXLAN(t *testing.T) {
	needRoot(t)
	nets := testutil.LoadNetworks(t, overlaytest.VXLANYAML)
	n := nets.Get("lab")
	if n.MTU != 1450 {
		t.Fatalf("MTU %d, want 1450", n.MTU)
	}
	underlay := newUnderlay(t, "underlay")
	var hosts []*vxlanHost
	for i := range 3 {
		h := &vxlanHost{ns: underlayHost(t, underlay, "vx", i)}
		h.wan = wan(t, h.ns)
		h.nw = start(t, h.ns, n, Options{StateDir: t.TempDir()})
		hosts = append(hosts, h)
	}
	// DHCP messages each host's server received: only its own VM's count.
	heard := func() []uint64 {
		var out []uint64
		for _, h := range hosts {
			var sum uint64
			for _, c := range h.nw.Stats(nettypes.StatsQuery{}).DHCP.Requests {
				sum += c
			}
			out = append(out, sum)
		}
		return out
	}
	for i, h := range hosts {
		h.vm = vm(t, h.ns, fmt.Sprintf("vx%d", i+1), fmt.Sprintf("52:55:55:00:50:0%d", i+1), n.Bridge(), false)
		before := heard()
		l := mustUdhcpc(t, h.vm, fmt.Sprintf("vx%d", i+1))
		for j, c := range heard() {
			if j != i && c != before[j] {
				t.Errorf("host %d's DHCP server heard host %d's VM: DHCP crossed the tunnel", j+1, i+1)
			}
		}
		h.ip = netip.MustParseAddr(l["ip"])
		start, end := n.VXLANHostSlice(i)
		if h.ip.Less(start) || end.Less(h.ip) || l["router"] != n.Gateway.String() || l["mtu"] != "1450" {
			t.Errorf("host %d's VM leased %s (router %s, mtu %s), want one of %s-%s, router %s, mtu 1450", i+1, h.ip, l["router"], l["mtu"], start, end, n.Gateway)
		}
	}
	// No other host's DHCP server heard a VM that is not its own.
	for i, h := range hosts {
		for _, l := range h.nw.Leases() {
			if l.MAC != fmt.Sprintf("52:55:55:00:50:0%d", i+1) {
				t.Errorf("host %d leased %s to %s, another host's VM: DHCP crossed the tunnel", i+1, l.IP, l.MAC)
			}
		}
	}
	// ping sends size bytes of ICMP payload, not fragmented.
	ping := func(from *vxlanHost, to netip.Addr, size int) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := from.vm.Run(ctx, "ping", "-n", "-q", "-c", "1", "-W", "2", "-s", fmt.Sprint(size), "-M", "do", to.String())
		return err
	}
	// Full-size frames: 1450 - 28 bytes of IPv4 and ICMP headers.
	for _, pair := range [][2]int{{0, 1}, {1, 2}, {2, 0}} {
		from, to := hosts[pair[0]], hosts[pair[1]]
		if err := ping(from, to.ip, 1422); err != nil {
			t.Errorf("VM on host %d cannot reach %s on host %d with full-size frames: %v", pair[0]+1, to.ip, pair[1]+1, err)
		}
	}
	srv := hosts[1].vm.Listen(t, "tcp4", hosts[1].ip.String()+":0")
	go func() {
		for {
			c, err := srv.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	if err := dial(hosts[0].vm, srv.Addr().String(), 5*time.Second); err != nil {
		t.Errorf("TCP from host 1's VM to host 2's: %v", err)
	}
	for i, h := range hosts {
		addr, seen := tcpServer(t, h.wan)
		if err := dial(h.vm, addr, 5*time.Second); err != nil {
			t.Errorf("host %d's VM cannot reach its host's WAN: %v", i+1, err)
			continue
		}
		if src := <-seen; src != netip.MustParseAddr(wanHost) {
			t.Errorf("host %d's WAN saw %s, want its host's uplink %s (NAT on the VM's own host)", i+1, src, wanHost)
		}
	}
	// Names across hosts: each host knows its own VM by its VM-file name
	// (host 3's only by its DHCP host name); a VM resolves the others
	// through its own gateway, which asks the other hosts.
	for i, h := range hosts[:2] {
		if err := h.nw.SetHost(mustMAC(fmt.Sprintf("52:55:55:00:50:0%d", i+1)), fmt.Sprintf("web%d", i+1), netip.Addr{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		from int
		name string
		want netip.Addr
	}{
		{0, "web2.vmnet.internal", hosts[1].ip},
		{1, "web1", hosts[0].ip},
		{0, "vx3", hosts[2].ip}, // a DHCP host name on host 3
		{2, "web1.vmnet.internal", hosts[0].ip},
		{0, "web1", hosts[0].ip}, // its own host's
	} {
		resp, err := query(hosts[tc.from].vm, n.Gateway.String(), tc.name, dns.TypeA, "udp")
		if err != nil || answerA(resp) != tc.want.String() {
			t.Errorf("host %d's VM resolves %s to %v (%v), want %s", tc.from+1, tc.name, resp, err, tc.want)
		}
	}
	// A DHCP host name never takes a VM file's name, whichever host each
	// is on: host 3's VM asks DHCP for the name web1 (host 1's VM file's).
	if _, err := hosts[2].vm.DHCP(t, "eth0", "-x", "hostname:web1"); err != nil {
		t.Fatal(err)
	}
	for _, from := range []int{2, 1} {
		resp, err := query(hosts[from].vm, n.Gateway.String(), "web1", dns.TypeA, "udp")
		if err != nil || answerA(resp) != hosts[0].ip.String() {
			t.Errorf("host %d's VM resolves web1 to %v (%v), want host 1's VM-file name's %s, not host 3's DHCP name", from+1, resp, err, hosts[0].ip)
		}
	}
	if resp, err := query(hosts[0].vm, n.Gateway.String(), "nobody.vmnet.internal", dns.TypeA, "udp"); err != nil || resp.Rcode != dns.RcodeNameError {
		t.Errorf("a name no host knows: %v %v, want NXDOMAIN", resp, err)
	}
	// The hosts' name service answers the segment's hosts only.
	stranger := testutil.NewNS(t, "vx-stranger")
	veth(t, underlay, "ul-x", stranger, "")
	underlay.MustRun(t, "ip", "link", "set", "ul-x", "master", "ul")
	stranger.MustRun(t, "ip", "addr", "add", "10.77.0.99/24", "dev", "eth0")
	stranger.MustDo(t, func() error {
		m := new(dns.Msg)
		m.SetQuestion("web1.vmnet.internal.", dns.TypeA)
		c := &dns.Client{Net: "udp", Timeout: time.Second}
		if resp, _, err := c.Exchange(m, fmt.Sprintf("10.77.0.1:%d", n.VXLAN.DNSPort)); err == nil {
			return fmt.Errorf("a stranger on the underlay got an answer: %v", resp)
		}
		return nil
	})

	// A VM cannot put frames on the segment by sending VXLAN itself (to
	// its own host's tunnel, or to another host's through its host's NAT),
	// past its port's guard: an ARP request from a made-up MAC and address,
	// wrapped in VXLAN with the segment's VNI.
	forged := vxlanARP(n.VXLAN.VNI, "02:66:66:66:66:66", "10.200.50.99", hosts[1].ip)
	for _, to := range []string{n.Gateway.String(), "10.77.0.2"} {
		sendUDP(t, hosts[0].vm, "", net.JoinHostPort(to, fmt.Sprint(n.VXLAN.Port)), forged, 3)
	}
	// The forged request would be answered (and its MAC learned) at once.
	hosts[1].vm.Ping(hosts[0].ip.String(), 1)
	for i, h := range hosts[:2] {
		if fdb := h.ns.MustRun(t, "bridge", "fdb", "show"); strings.Contains(fdb, "02:66:66:66:66:66") {
			t.Errorf("host %d learned the MAC a VM forged inside VXLAN:\n%s", i+1, testutil.Lines(fdb, "02:66"))
		}
	}
	if out, _ := hosts[1].vm.Run(context.Background(), "ip", "neigh", "show", "10.200.50.99"); strings.Contains(out, "02:66") {
		t.Errorf("host 2's VM took the forged ARP from inside VXLAN: %s", out)
	}

	gw := hostnet.BridgeMAC(n.ID).String()
	for i, h := range hosts {
		fdb := h.ns.MustRun(t, "bridge", "fdb", "show", "dev", api.VXLANName(n.ID))
		if strings.Contains(fdb, gw+" master") {
			t.Errorf("host %d's bridge learned the gateway's MAC from the tunnel:\n%s", i+1, fdb)
		}
		tun := h.nw.Stats(nettypes.StatsQuery{}).Tunnel
		if tun == nil || tun.Host != fmt.Sprintf("h%d", i+1) || len(tun.Peers) != 2 || tun.RemoteMACs < 2 || tun.TxBytes == 0 || tun.RxBytes == 0 || tun.Dropped == 0 {
			t.Errorf("host %d: tunnel stats %+v, want host h%d flooding to the 2 other hosts, at least their 2 VMs learned, bytes both ways, drops", i+1, tun, i+1)
		}
		var drops map[string]uint64
		h.ns.MustDo(t, func() (err error) {
			drops, err = guard.Drops(context.Background(), n.ID, []string{api.VXLANName(n.ID)})
			return err
		})
		if drops[api.VXLANName(n.ID)] == 0 {
			t.Errorf("host %d's tunnel guard dropped nothing (the other gateways' ARP and router advertisements come through): %v", i+1, drops)
		}
	}
	hosts[0].ns.MustDo(t, func() error { return Check(context.Background(), n) })

	// Host 3 leaves: 1 and 2 still talk. It comes back: its VM is reached.
	hosts[2].nw.Close()
	hosts[2].ns.MustDo(t, func() error { return Remove(context.Background(), n.ID, "") })
	if err := ping(hosts[0], hosts[1].ip, 1422); err != nil {
		t.Errorf("with host 3 gone, host 1's VM cannot reach host 2's: %v", err)
	}
	if err := hosts[0].vm.Ping(hosts[2].ip.String(), 1); err == nil {
		t.Errorf("host 3's VM answers with its network removed")
	}
	hosts[2].nw = start(t, hosts[2].ns, n, Options{StateDir: t.TempDir()})
	hosts[2].ns.MustRun(t, "ip", "link", "set", "p-vx3", "master", n.Bridge())
	testutil.Eventually(t, 10*time.Second, func() error { return ping(hosts[0], hosts[2].ip, 1422) }, "host 3's VM to be reached again")
}

// TestVXLANOwner: the VXLAN device is made as the bridge is (a temporary
// name carrying the state dir's owner, marked, renamed): a creation cut
// short before its mark or its rename leaves a device that the next Ensure
// and down --all (Sweep) remove; another state dir's device of the same
// name, or an unmarked one, is an error and left alone by this state dir's
// Ensure and Sweep.
func TestVXLANOwner(t *testing.T) {
	host, n := overlaytest.Lab(t, "vx-owner", "10.77.0.1/24")
	const a, b = "/state/a", "/state/b"
	tmpA := markAs(a, func() string { return hostnet.TmpVXLANName(n.ID) })
	if len(tmpA) > 15 || tmpA == markAs(a, func() string { return hostnet.TmpBridgeName(n.ID) }) {
		t.Fatalf("temporary VXLAN name %q: want one within IFNAMSIZ, apart from the bridge's", tmpA)
	}
	vxlanArgs := []string{"type", "vxlan", "id", "4242", "local", "10.77.0.1", "dstport", "4789"}
	// Cut short before the mark, and after the mark before the rename.
	host.MustRun(t, "ip", append([]string{"link", "add", tmpA}, vxlanArgs...)...)
	asOwner(t, a)
	host.MustDo(t, func() error { return Ensure(context.Background(), n) })
	host.MustDo(t, func() error {
		if linkExists(tmpA) {
			return fmt.Errorf("the temporary %s is left after Ensure", tmpA)
		}
		if l, err := netlink.LinkByName(api.VXLANName(n.ID)); err != nil || l.Attrs().Alias != hostnet.Mark(n.ID) {
			return fmt.Errorf("%s after Ensure: %v", api.VXLANName(n.ID), err)
		}
		return Check(context.Background(), n)
	})
	host.MustRun(t, "ip", append([]string{"link", "add", tmpA}, append(vxlanArgs[:len(vxlanArgs)-2], "dstport", "4790")...)...)
	host.MustRun(t, "ip", "link", "set", tmpA, "alias", hostnet.Mark(n.ID))
	host.MustDo(t, func() error {
		removed, err := Sweep(context.Background(), nil, t.TempDir())
		if err == nil && (linkExists(tmpA) || linkExists(api.VXLANName(n.ID))) {
			err = fmt.Errorf("after down --all (removed %v): %s exists %v, %s exists %v", removed, tmpA, linkExists(tmpA), api.VXLANName(n.ID), linkExists(api.VXLANName(n.ID)))
		}
		return err
	})
	// Another state dir's device under the name, then an unmarked one:
	// refused by a's Ensure, left alone by a's down --all.
	for _, alias := range []string{markAs(b, func() string { return hostnet.Mark(n.ID) }), ""} {
		host.MustRun(t, "ip", append([]string{"link", "add", api.VXLANName(n.ID)}, vxlanArgs...)...)
		if alias != "" {
			host.MustRun(t, "ip", "link", "set", api.VXLANName(n.ID), "alias", alias)
		}
		host.MustDo(t, func() error {
			err := Ensure(context.Background(), n)
			if err == nil || !strings.Contains(err.Error(), "is not this network's VXLAN device") {
				return fmt.Errorf("a's Ensure with %s there (alias %q): %v, want a refusal", api.VXLANName(n.ID), alias, err)
			}
			if _, err := Sweep(context.Background(), nil, t.TempDir()); err != nil {
				return err
			}
			if !linkExists(api.VXLANName(n.ID)) {
				return fmt.Errorf("a's down --all deleted %s (alias %q)", api.VXLANName(n.ID), alias)
			}
			return netlink.LinkDel(&netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: api.VXLANName(n.ID)}})
		})
	}
}

// TestVXLANSegments: two networks across the same hosts share each host's
// name service (the same underlay address and dnsPort), each asked by its
// VNI; both start, answer their own names, and stop.
func TestVXLANSegments(t *testing.T) {
	needRoot(t)
	yaml := overlaytest.VXLANYAML + `  lab2:
    mode: host
    gateway: 10.200.51.1
    netmask: 255.255.255.0
    vxlan:
      vni: 4243
      hosts:
        - {name: h1, address: 10.77.0.1}
        - {name: h2, address: 10.77.0.2}
`
	nets := testutil.LoadNetworks(t, yaml)
	underlay := newUnderlay(t, "vs-ul")
	var hs []*testutil.NS
	var nws [][]*Network
	for i := range 2 {
		h := underlayHost(t, underlay, "vs", i)
		hs = append(hs, h)
		var two []*Network
		for _, id := range []string{"lab", "lab2"} {
			nw := start(t, h, nets.Get(id), Options{StateDir: t.TempDir()})
			if err := nw.SetHost(mustMAC(fmt.Sprintf("52:55:55:00:51:%d%d", i, len(two))), fmt.Sprintf("%s-h%d", id, i+1), netip.MustParseAddr(fmt.Sprintf("%s.%d", map[string]string{"lab": "10.200.50", "lab2": "10.200.51"}[id], 200+i))); err != nil {
				t.Fatal(err)
			}
			two = append(two, nw)
		}
		nws = append(nws, two)
	}
	// From host 1's VM on each network, host 2's VM of that network.
	for j, id := range []string{"lab", "lab2"} {
		n := nets.Get(id)
		v := vm(t, hs[0], fmt.Sprintf("vs%d", j), fmt.Sprintf("52:55:55:00:52:0%d", j), n.Bridge(), false)
		v.MustRun(t, "ip", "addr", "add", n.Gateway.Next().Next().Next().String()+"/24", "dev", "eth0")
		want := map[string]string{"lab": "10.200.50.201", "lab2": "10.200.51.201"}[id]
		resp, err := query(v, n.Gateway.String(), id+"-h2", dns.TypeA, "udp")
		if err != nil || answerA(resp) != want {
			t.Errorf("%s: host 1 resolves %s-h2 to %v (%v), want %s", id, id, resp, err, want)
		}
	}
	done := make(chan struct{})
	go func() {
		for _, two := range nws {
			for _, nw := range two {
				nw.Close()
			}
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("closing networks that share a name service hangs")
	}
}

// TestVXLANDrift: what is changed in the tunnel behind vmnetctl's back is
// found by Check and put back by Ensure: a flooding entry to a stranger,
// the tunnel's guard, its MTU; and a network no longer across hosts loses
// its tunnel.
func TestVXLANDrift(t *testing.T) {
	host, n := overlaytest.Lab(t, "vx-drift", "10.77.0.1/24")
	vx := api.VXLANName(n.ID)
	host.MustDo(t, func() error { return Ensure(context.Background(), n) })
	for _, d := range []struct {
		name string
		cmd  []string
	}{
		{"a flooding entry to a stranger", []string{"bridge", "fdb", "append", "00:00:00:00:00:00", "dev", vx, "dst", "192.0.2.66"}},
		{"the tunnel's guard", []string{"nft", "delete", "element", "bridge", hostnet.TableName(n.ID), guard.SetTunnels, "{ " + strings.TrimSpace(host.MustRun(t, "cat", "/sys/class/net/"+vx+"/ifindex")) + " }"}},
		{"the tunnel's MTU", []string{"ip", "link", "set", vx, "mtu", "1300"}},
	} {
		host.MustRun(t, d.cmd[0], d.cmd[1:]...)
		host.MustDo(t, func() error {
			if err := Check(context.Background(), n); err == nil {
				return fmt.Errorf("%s changed: Check finds nothing", d.name)
			}
			if err := Ensure(context.Background(), n); err != nil {
				return err
			}
			if err := Check(context.Background(), n); err != nil {
				return fmt.Errorf("%s changed, then Ensure: %v", d.name, err)
			}
			return nil
		})
	}
	alone := *n
	alone.VXLAN = nil
	alone.MTU = api.DefaultMTU
	host.MustDo(t, func() error {
		if err := Check(context.Background(), &alone); err == nil {
			return fmt.Errorf("the network is no longer across hosts and keeps its tunnel: Check finds nothing")
		}
		if err := Ensure(context.Background(), &alone); err != nil {
			return err
		}
		if linkExists(vx) {
			return fmt.Errorf("%s left after Ensure of the network without vxlan", vx)
		}
		return Check(context.Background(), &alone)
	})
}

// vxlanARP is a VXLAN packet's UDP payload on segment vni: an ARP request
// from mac and ip for target, broadcast.
func vxlanARP(vni uint32, mac, ip string, target netip.Addr) []byte {
	b := []byte{0x08, 0, 0, 0, byte(vni >> 16), byte(vni >> 8), byte(vni), 0}
	hw, _ := net.ParseMAC(mac)
	b = append(b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)
	b = append(b, hw...)
	b = append(b, 0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1)
	b = append(b, hw...)
	b = append(b, netip.MustParseAddr(ip).AsSlice()...)
	b = append(b, 0, 0, 0, 0, 0, 0)
	return append(b, target.AsSlice()...)
}

// newUnderlay is a namespace named label with the underlay bridge ul that
// underlayHost joins hosts to.
func newUnderlay(t *testing.T, label string) *testutil.NS {
	t.Helper()
	underlay := testutil.NewNS(t, label)
	underlay.MustRun(t, "ip", "link", "add", "ul", "up", "type", "bridge")
	return underlay
}

// underlayHost makes host i+1 of an underlay bridge ul (in namespace
// underlay, newUnderlay): a namespace named prefix-hN whose eth0, on ul,
// has 10.77.0.N.
func underlayHost(t *testing.T, underlay *testutil.NS, prefix string, i int) *testutil.NS {
	t.Helper()
	h := testutil.NewNS(t, fmt.Sprintf("%s-h%d", prefix, i+1))
	veth(t, underlay, fmt.Sprintf("ul-h%d", i+1), h, "")
	underlay.MustRun(t, "ip", "link", "set", fmt.Sprintf("ul-h%d", i+1), "master", "ul")
	h.MustRun(t, "ip", "addr", "add", fmt.Sprintf("10.77.0.%d/24", i+1), "dev", "eth0")
	return h
}
