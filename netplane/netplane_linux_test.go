package netplane

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/guard"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/leases"
	"github.com/vmnetctl/vmnetctl/nettypes"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// start starts n in namespace host and closes it at cleanup.
func start(t *testing.T, host *testutil.NS, n *api.Network, opts Options) *Network {
	t.Helper()
	var nw *Network
	host.MustDo(t, func() error {
		var err error
		nw, err = Start(context.Background(), n, opts)
		return err
	})
	t.Cleanup(func() { nw.Close() })
	return nw
}

func checkLease(t *testing.T, n *api.Network, l map[string]string, wantDNS string) netip.Addr {
	t.Helper()
	a, err := netip.ParseAddr(l["ip"])
	if err != nil {
		t.Fatalf("lease address %q: %v", l["ip"], err)
	}
	if a.Less(n.DHCPStart) || n.DHCPEnd.Less(a) {
		t.Errorf("leased %s, outside %s-%s", a, n.DHCPStart, n.DHCPEnd)
	}
	want := map[string]string{
		"router": n.Gateway.String(), "dns": wantDNS, "mtu": fmt.Sprint(n.MTU),
		"mask": fmt.Sprint(n.Subnet.Bits()), "serverid": n.Gateway.String(),
		"lease": fmt.Sprint(int(n.LeaseTime.Seconds())),
	}
	for k, v := range want {
		if got := strings.TrimSpace(l[k]); got != v {
			t.Errorf("lease %s = %q, want %q", k, got, v)
		}
	}
	return a
}

func query(v *testutil.NS, server, name string, qtype uint16, network string) (*dns.Msg, error) {
	var resp *dns.Msg
	err := v.Do(func() error {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), qtype)
		c := &dns.Client{Net: network, Timeout: 2 * time.Second}
		var err error
		resp, _, err = c.Exchange(m, net.JoinHostPort(server, "53"))
		return err
	})
	return resp, err
}

func answerA(m *dns.Msg) string {
	for _, rr := range m.Answer {
		if a, ok := rr.(*dns.A); ok {
			return a.A.String()
		}
	}
	return ""
}

// wanDNS serves example.test. A 192.0.2.7 on wanPeer:53 in namespace w.
func wanDNS(t *testing.T, w *testutil.NS) {
	t.Helper()
	pc, ln := w.ListenPacket(t, "udp4", wanPeer+":53"), w.Listen(t, "tcp4", wanPeer+":53")
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		if r.Question[0].Name == "example.test." {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: "example.test.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60},
				A: net.ParseIP("192.0.2.7")})
		} else {
			m.Rcode = dns.RcodeNameError
		}
		w.WriteMsg(m)
	})
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: ln, Handler: h}} {
		go srv.ActivateAndServe()
		t.Cleanup(func() { srv.Shutdown() })
	}
}

// gateWant is the forward chain's jumps to the name check's gate, where n
// has one here.
func gateWant(n *api.Network) []string {
	if !nameGates(n) {
		return nil
	}
	br := `"` + n.Bridge() + `"`
	return []string{
		`iifname ` + br + ` ct mark & 0x03000000 != 0x00000000 jump name-gate`,
		`oifname ` + br + ` ct mark & 0x03000000 != 0x00000000 jump name-gate`,
	}
}

func TestShared(t *testing.T) {
	needRoot(t)
	host := testutil.NewNS(t, "shared-host")
	w := wan(t, host)
	wanDNS(t, w)
	n := testNet("lan1", api.ModeShared, "10.200.1.0/24")
	nw := start(t, host, n, Options{StateDir: t.TempDir(), Upstreams: []string{wanPeer + ":53"}})
	wantRules(t, "forward chain of a shared network", chainRules(t, host, n.ID, "forward"), append(append(append(neighWant("vmn-lan1"), `iifname "vmn-lan1" oifname "vmn-lan1" accept`), gateWant(n)...), []string{
		`oifname "vmn-lan1" ct direction original ct status dnat accept`,
		`iifname "vmn-lan1" ct direction reply ct status dnat accept`,
		`iifname "vmn-lan1" ct state != { established, related } ip saddr . ip daddr @egress-vmnonames4 goto egress-denied`,
		`iifname "vmn-lan1" ct state != { established, related } ip6 saddr . ip6 daddr @egress-vmnonames6 goto egress-denied`,
		`iifname "vmn-lan1" ct state != { established, related } ip saddr @egress-own4 ip saddr . ip daddr vmap @egress-vm4`,
		`iifname "vmn-lan1" ct state != { established, related } ip6 saddr @egress-own6 ip6 saddr . ip6 daddr vmap @egress-vm6`,
		`iifname "vmn-lan1" ip saddr 10.200.1.0/24 accept`,
		`oifname "vmn-lan1" ct state established,related accept`,
		`oifname "vmn-lan1" drop`,
		`iifname "vmn-lan1" drop`,
	}...))

	v := vm(t, host, "vm1", "52:55:55:00:01:01", n.Bridge(), false)
	l := mustUdhcpc(t, v, "guest1")
	addr := checkLease(t, n, l, n.Gateway.String())
	if err := v.Ping(n.Gateway.String(), 1); err != nil {
		t.Errorf("VM cannot ping the gateway: %v", err)
	}

	t.Run("NAT", func(t *testing.T) {
		srv, seen := tcpServer(t, w)
		if err := dial(v, srv, 5*time.Second); err != nil {
			t.Fatalf("VM cannot reach the WAN: %v", err)
		}
		if src := <-seen; src != netip.MustParseAddr(wanHost) {
			t.Errorf("WAN server saw %s, want the uplink address %s", src, wanHost)
		}
	})

	t.Run("DNS", func(t *testing.T) {
		if err := nw.SetHost(mustMAC("52:55:55:00:01:01"), "vm1", netip.Addr{}); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct{ name, proto, want string }{
			{"vm1.vmnet.internal", "udp", addr.String()},
			{"vm1.vmnet.internal", "tcp", addr.String()},
			{"vm1", "udp", addr.String()},
			{"guest1.vmnet.internal", "udp", addr.String()}, // the DHCP hostname
			{"example.test", "udp", "192.0.2.7"},            // forwarded to the WAN resolver
			{"example.test", "tcp", "192.0.2.7"},
		} {
			resp, err := query(v, n.Gateway.String(), tc.name, dns.TypeA, tc.proto)
			if err != nil {
				t.Errorf("%s over %s: %v", tc.name, tc.proto, err)
				continue
			}
			if got := answerA(resp); got != tc.want {
				t.Errorf("%s over %s: answer %q, want %q (%v)", tc.name, tc.proto, got, tc.want, resp)
			}
		}
		resp, err := query(v, n.Gateway.String(), "nosuch.vmnet.internal", dns.TypeA, "udp")
		if err != nil || resp.Rcode != dns.RcodeNameError {
			t.Errorf("unknown VM name: %v %v, want NXDOMAIN", resp, err)
		}
		s := nw.Stats(nettypes.StatsQuery{})
		if s.DNS.Queries < 7 || s.DNS.Local < 4 || s.DNS.Forwarded < 2 || s.DNS.NXDomain < 1 {
			t.Errorf("DNS stats %+v", s.DNS)
		}
	})

	t.Run("Stats", func(t *testing.T) {
		s := nw.Stats(nettypes.StatsQuery{})
		if s.DHCP.Requests["DISCOVER"] < 1 || s.DHCP.Requests["REQUEST"] < 1 || s.DHCP.Replies["ACK"] < 1 {
			t.Errorf("DHCP stats %+v", s.DHCP)
		}
		if ls := nw.Leases(); len(ls) != 1 || ls[0].IP != addr || ls[0].MAC != "52:55:55:00:01:01" || ls[0].Hostname != "guest1" {
			t.Errorf("leases %+v", ls)
		}
		// The MACs the bridge learned only when asked (a status, not a
		// scrape).
		if s.PortMACs != nil {
			t.Errorf("MACs not asked for, yet read: %v", s.PortMACs)
		}
		learned := nw.Stats(nettypes.StatsQuery{MACs: true}).PortMACs
		if !slices.ContainsFunc(slices.Collect(maps.Values(learned)), func(macs []string) bool { return slices.Contains(macs, "52:55:55:00:01:01") }) {
			t.Errorf("MACs asked for: %v, want the VM's on its port", learned)
		}
	})

	t.Run("EnsureTwice", func(t *testing.T) {
		// The kernel settles the bridge's operstate in its own time.
		testutil.Eventually(t, 5*time.Second, func() error {
			return host.Do(func() error {
				l, err := netlink.LinkByName(n.Bridge())
				if err == nil && l.Attrs().OperState != netlink.OperUp {
					err = fmt.Errorf("operstate %s", l.Attrs().OperState)
				}
				return err
			})
		}, "bridge operstate up")
		before := snapshot(t, host)
		host.MustDo(t, func() error { return Ensure(context.Background(), n) })
		if after := snapshot(t, host); after != before {
			t.Errorf("second Ensure changed the host:\n%s", lineDiff(before, after))
		}
		var fwd []byte
		host.MustDo(t, func() (err error) { fwd, err = os.ReadFile("/proc/sys/net/ipv4/ip_forward"); return err })
		if strings.TrimSpace(string(fwd)) != "1" {
			t.Errorf("ip_forward = %q", fwd)
		}
	})

	t.Run("Inspect", func(t *testing.T) {
		var s *State
		host.MustDo(t, func() (err error) { s, err = Inspect(context.Background(), n.ID); return err })
		if s.Bridge != n.Bridge() || !s.Up || s.MTU != n.MTU || len(s.Addrs) != 1 || s.Addrs[0] != netip.MustParsePrefix("10.200.1.1/24") ||
			len(s.Ports) != 1 || s.Ports[0] != "p-vm1" || !strings.Contains(s.Table, "masquerade") {
			t.Errorf("Inspect: %+v", s)
		}
	})

	t.Run("CheckAndRepair", func(t *testing.T) {
		host.MustDo(t, func() error { return Check(context.Background(), n) })
		// Break what Ensure set up; Check names it, Ensure repairs it.
		host.MustRun(t, "ip", "link", "set", n.Bridge(), "down")
		host.MustRun(t, "nft", "flush", "chain", "inet", hostnet.TableName(n.ID), "postrouting")
		var err error
		host.Do(func() error { err = Check(context.Background(), n); return nil })
		if err == nil || !strings.Contains(err.Error(), "is down") || !strings.Contains(err.Error(), "masquerade") {
			t.Errorf("Check after breaking: %v", err)
		}
		host.MustDo(t, func() error { return Ensure(context.Background(), n) })
		host.MustDo(t, func() error { return Check(context.Background(), n) })
		if err := v.Ping(n.Gateway.String(), 1); err != nil {
			t.Errorf("VM cannot ping the gateway after repair: %v", err)
		}
	})
}

func TestHost(t *testing.T) {
	needRoot(t)
	host := testutil.NewNS(t, "host-host")
	w := wan(t, host)
	// A host that forwards: the drop rules, not the sysctl, must stop VMs.
	host.MustDo(t, func() error { return hostnet.EnsureSysctl("/proc/sys/net/ipv4/ip_forward", "1") })
	n := testNet("hostonly", api.ModeHost, "10.200.2.0/24")
	start(t, host, n, Options{Upstreams: []string{wanPeer + ":53"}})
	v := vm(t, host, "vm1", "52:55:55:00:02:01", n.Bridge(), false)
	vmAddr := checkLease(t, n, mustUdhcpc(t, v, ""), n.Gateway.String())
	if err := v.Ping(n.Gateway.String(), 1); err != nil {
		t.Errorf("VM cannot ping the gateway: %v", err)
	}
	wantRules(t, "forward chain of a host network", chainRules(t, host, n.ID, "forward"), append(neighWant("vmn-hostonly"), []string{
		`iifname "vmn-hostonly" oifname "vmn-hostonly" accept`,
		`oifname "vmn-hostonly" ct direction original ct status dnat accept`,
		`iifname "vmn-hostonly" ct direction reply ct status dnat accept`,
		`iifname "vmn-hostonly" ct state != { established, related } ip saddr . ip daddr @egress-vmnonames4 goto egress-denied`,
		`iifname "vmn-hostonly" ct state != { established, related } ip6 saddr . ip6 daddr @egress-vmnonames6 goto egress-denied`,
		`iifname "vmn-hostonly" ct state != { established, related } ip saddr @egress-own4 ip saddr . ip daddr vmap @egress-vm4`,
		`iifname "vmn-hostonly" ct state != { established, related } ip6 saddr @egress-own6 ip6 saddr . ip6 daddr vmap @egress-vm6`,
		`iifname "vmn-hostonly" drop`,
		`oifname "vmn-hostonly" drop`,
	}...))
	srv, seen := tcpServer(t, w)
	// cutOff checks that the VM reaches nothing beyond the host.
	cutOff := func(when string) {
		t.Helper()
		if err := dial(v, srv, time.Second); err == nil {
			t.Errorf("%s: VM on a host network reached the WAN", when)
		}
		if err := v.Ping(wanPeer, 1); err == nil {
			t.Errorf("%s: VM on a host network pinged the WAN", when)
		}
		select {
		case src := <-seen:
			t.Errorf("%s: WAN server saw a connection from %s", when, src)
		default:
		}
	}
	cutOff("with the host network's rules")

	// The control: the WAN routes the VM subnet back, so without the
	// forward rules the same VM reaches the same server, with its own
	// address (nothing masquerades a host network). The rules, and only
	// they, are what cut it off.
	setForwardRules(t, host, n, false)
	if err := dial(v, srv, 5*time.Second); err != nil {
		t.Errorf("without the forward rules the VM still cannot reach the WAN (so the check above proves nothing): %v", err)
	} else {
		select {
		case src := <-seen:
			if src != vmAddr {
				t.Errorf("without the forward rules the WAN server saw %s, want the VM's %s", src, vmAddr)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("the VM connected, but the WAN server saw no connection")
		}
	}
	if err := v.Ping(wanPeer, 1); err != nil {
		t.Errorf("without the forward rules the VM still cannot ping the WAN: %v", err)
	}
	setForwardRules(t, host, n, true)
	cutOff("with the rules restored")

	// The host itself reaches the VM.
	if err := host.Ping(vmAddr.String(), 1); err != nil {
		t.Errorf("host cannot ping its VM: %v", err)
	}
}

func TestIsolation(t *testing.T) {
	needRoot(t)
	host := testutil.NewNS(t, "iso-host")
	n := testNet("iso", api.ModeShared, "10.200.3.0/24")
	n.Isolation = true
	start(t, host, n, Options{})
	wantRules(t, "forward chain of an isolated shared network", chainRules(t, host, n.ID, "forward"), append(append(append(neighWant("vmn-iso"), `iifname "vmn-iso" oifname "vmn-iso" drop`), gateWant(n)...), []string{
		`oifname "vmn-iso" ct direction original ct status dnat accept`,
		`iifname "vmn-iso" ct direction reply ct status dnat accept`,
		`iifname "vmn-iso" ct state != { established, related } ip saddr . ip daddr @egress-vmnonames4 goto egress-denied`,
		`iifname "vmn-iso" ct state != { established, related } ip6 saddr . ip6 daddr @egress-vmnonames6 goto egress-denied`,
		`iifname "vmn-iso" ct state != { established, related } ip saddr @egress-own4 ip saddr . ip daddr vmap @egress-vm4`,
		`iifname "vmn-iso" ct state != { established, related } ip6 saddr @egress-own6 ip6 saddr . ip6 daddr vmap @egress-vm6`,
		`iifname "vmn-iso" ip saddr 10.200.3.0/24 accept`,
		`oifname "vmn-iso" ct state established,related accept`,
		`oifname "vmn-iso" drop`,
		`iifname "vmn-iso" drop`,
	}...))
	a := vm(t, host, "a", "52:55:55:00:03:01", n.Bridge(), true)
	b := vm(t, host, "b", "52:55:55:00:03:02", n.Bridge(), true)
	// c's port is not isolated: the control for layer 2.
	c := vm(t, host, "c", "52:55:55:00:03:03", n.Bridge(), false)
	la := mustUdhcpc(t, a, "")
	lb := mustUdhcpc(t, b, "")
	lc := mustUdhcpc(t, c, "")
	if err := a.Ping(n.Gateway.String(), 1); err != nil {
		t.Errorf("isolated VM cannot ping the gateway: %v", err)
	}

	// Layer 2: isolated ports do not reach each other, but an isolated port
	// reaches a port that is not, on the same bridge. With br_netfilter
	// loaded, bridged frames pass the inet forward hook too (in and out by
	// the bridge), where the bridge-to-bridge drop rule would stop a to c
	// as well: turned off here, so these checks measure port isolation alone.
	host.MustDo(t, func() error {
		const bridgeNF = "/proc/sys/net/bridge/bridge-nf-call-iptables"
		if _, err := os.Stat(bridgeNF); err != nil {
			return nil // no br_netfilter: bridged frames skip nftables anyway
		}
		return hostnet.EnsureSysctl(bridgeNF, "0")
	})
	if err := a.Ping(lb["ip"], 1); err == nil {
		t.Errorf("isolated VM a pinged isolated VM b at %s", lb["ip"])
	}
	if err := a.Ping(lc["ip"], 1); err != nil {
		t.Errorf("isolated VM a cannot ping VM c (port not isolated) at %s, so the check above proves nothing: %v", lc["ip"], err)
	}

	// Layer 3: a and b route to each other through the gateway, and ignore
	// the host's redirects ("talk directly"). The bridge-to-bridge drop rule
	// stops that; without it the same ping goes through.
	for _, x := range []struct {
		v    *testutil.NS
		peer string
	}{{a, lb["ip"]}, {b, la["ip"]}} {
		x.v.MustRun(t, "ip", "route", "add", x.peer+"/32", "via", n.Gateway.String())
		x.v.MustDo(t, func() error {
			for _, dev := range []string{"all", "eth0"} {
				if err := hostnet.EnsureSysctl("/proc/sys/net/ipv4/conf/"+dev+"/accept_redirects", "0"); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := a.Ping(lb["ip"], 1); err == nil {
		t.Errorf("isolated VM a pinged isolated VM b at %s through the gateway", lb["ip"])
	}
	setForwardRules(t, host, n, false)
	if err := a.Ping(lb["ip"], 1); err != nil {
		t.Errorf("without the forward rules VM a still cannot ping VM b through the gateway (so the check above proves nothing): %v", err)
	}
	setForwardRules(t, host, n, true)
	if err := a.Ping(lb["ip"], 1); err == nil {
		t.Errorf("with the rules restored, isolated VM a pinged isolated VM b at %s through the gateway", lb["ip"])
	}
}

// neighWant is the forward chain's first rules on bridge br: the bound on
// the host's neighbour entries (neigh.go).
func neighWant(br string) []string {
	v4 := `iifname "` + br + `" ct state new meta nfproto ipv4 rt ip nexthop != @nexthops4`
	v6 := `iifname "` + br + `" ct state new meta nfproto ipv6 rt ip6 nexthop != @nexthops6`
	const perPort = ` add @nexthop-new { ether saddr limit rate over 2/second burst 32 packets } counter name "neigh-limited" drop`
	return []string{
		v4 + perPort,
		v4 + ` add @nexthops4 { rt ip nexthop }`,
		v4 + ` counter name "neigh-limited" drop`,
		v6 + perPort,
		v6 + ` add @nexthops6 { rt ip6 nexthop }`,
		v6 + ` counter name "neigh-limited" drop`,
	}
}

// TestForwardChain pins the forward chain of each kind of network, rule by
// rule: the data-plane tests above show that these rules are what stops
// (or lets through) the traffic.
func TestForwardChain(t *testing.T) {
	shared := testNet("s", api.ModeShared, "10.9.0.0/24")
	isolated := testNet("i", api.ModeShared, "10.9.1.0/24")
	isolated.Isolation = true
	hostOnly := testNet("h", api.ModeHost, "10.9.2.0/24")
	isoHost := testNet("j", api.ModeHost, "10.9.3.0/24")
	isoHost.Isolation = true
	routed := testNet("r", api.ModeShared, "10.9.4.0/24")
	routed.NAT44 = false
	for _, tc := range []struct {
		n    *api.Network
		want []string
	}{
		{shared, append(neighWant("vmn-s"), []string{
			`iifname "vmn-s" oifname "vmn-s" accept`,
			`oifname "vmn-s" ct direction original ct status dnat accept`,
			`iifname "vmn-s" ct direction reply ct status dnat accept`,
			`iifname "vmn-s" ct state != { established, related } ip saddr . ip daddr @egress-vmnonames4 goto egress-denied`,
			`iifname "vmn-s" ct state != { established, related } ip6 saddr . ip6 daddr @egress-vmnonames6 goto egress-denied`,
			`iifname "vmn-s" ct state != { established, related } ip saddr @egress-own4 ip saddr . ip daddr vmap @egress-vm4`,
			`iifname "vmn-s" ct state != { established, related } ip6 saddr @egress-own6 ip6 saddr . ip6 daddr vmap @egress-vm6`,
			`iifname "vmn-s" ip saddr 10.9.0.0/24 accept`,
			`oifname "vmn-s" ct state established,related accept`,
			`oifname "vmn-s" drop`,
			`iifname "vmn-s" drop`,
		}...)},
		{isolated, append(neighWant("vmn-i"), []string{
			`iifname "vmn-i" oifname "vmn-i" drop`,
			`oifname "vmn-i" ct direction original ct status dnat accept`,
			`iifname "vmn-i" ct direction reply ct status dnat accept`,
			`iifname "vmn-i" ct state != { established, related } ip saddr . ip daddr @egress-vmnonames4 goto egress-denied`,
			`iifname "vmn-i" ct state != { established, related } ip6 saddr . ip6 daddr @egress-vmnonames6 goto egress-denied`,
			`iifname "vmn-i" ct state != { established, related } ip saddr @egress-own4 ip saddr . ip daddr vmap @egress-vm4`,
			`iifname "vmn-i" ct state != { established, related } ip6 saddr @egress-own6 ip6 saddr . ip6 daddr vmap @egress-vm6`,
			`iifname "vmn-i" ip saddr 10.9.1.0/24 accept`,
			`oifname "vmn-i" ct state established,related accept`,
			`oifname "vmn-i" drop`,
			`iifname "vmn-i" drop`,
		}...)},
		{hostOnly, append(neighWant("vmn-h"), []string{
			`iifname "vmn-h" oifname "vmn-h" accept`,
			`oifname "vmn-h" ct direction original ct status dnat accept`,
			`iifname "vmn-h" ct direction reply ct status dnat accept`,
			`iifname "vmn-h" ct state != { established, related } ip saddr . ip daddr @egress-vmnonames4 goto egress-denied`,
			`iifname "vmn-h" ct state != { established, related } ip6 saddr . ip6 daddr @egress-vmnonames6 goto egress-denied`,
			`iifname "vmn-h" ct state != { established, related } ip saddr @egress-own4 ip saddr . ip daddr vmap @egress-vm4`,
			`iifname "vmn-h" ct state != { established, related } ip6 saddr @egress-own6 ip6 saddr . ip6 daddr vmap @egress-vm6`,
			`iifname "vmn-h" drop`,
			`oifname "vmn-h" drop`,
		}...)},
		{isoHost, append(neighWant("vmn-j"), []string{
			`iifname "vmn-j" oifname "vmn-j" drop`,
			`oifname "vmn-j" ct direction original ct status dnat accept`,
			`iifname "vmn-j" ct direction reply ct status dnat accept`,
			`iifname "vmn-j" ct state != { established, related } ip saddr . ip daddr @egress-vmnonames4 goto egress-denied`,
			`iifname "vmn-j" ct state != { established, related } ip6 saddr . ip6 daddr @egress-vmnonames6 goto egress-denied`,
			`iifname "vmn-j" ct state != { established, related } ip saddr @egress-own4 ip saddr . ip daddr vmap @egress-vm4`,
			`iifname "vmn-j" ct state != { established, related } ip6 saddr @egress-own6 ip6 saddr . ip6 daddr vmap @egress-vm6`,
			`iifname "vmn-j" drop`,
			`oifname "vmn-j" drop`,
		}...)},
		{routed, append(neighWant("vmn-r"), []string{
			`iifname "vmn-r" oifname "vmn-r" accept`,
			`oifname "vmn-r" ct direction original ct status dnat accept`,
			`iifname "vmn-r" ct direction reply ct status dnat accept`,
			`iifname "vmn-r" ct state != { established, related } ip saddr . ip daddr @egress-vmnonames4 goto egress-denied`,
			`iifname "vmn-r" ct state != { established, related } ip6 saddr . ip6 daddr @egress-vmnonames6 goto egress-denied`,
			`iifname "vmn-r" ct state != { established, related } ip saddr @egress-own4 ip saddr . ip daddr vmap @egress-vm4`,
			`iifname "vmn-r" ct state != { established, related } ip6 saddr @egress-own6 ip6 saddr . ip6 daddr vmap @egress-vm6`,
			`iifname "vmn-r" ip saddr 10.9.4.0/24 accept`,
			`oifname "vmn-r" ct state established,related accept`,
			`oifname "vmn-r" drop`,
			`iifname "vmn-r" drop`,
		}...)},
	} {
		wantRules(t, "forward chain of network "+tc.n.ID, nftRules(tc.n, false)["forward"], tc.want)
	}
	for _, r := range nftRules(routed, false)["postrouting"] {
		if strings.Contains(r, "oifname != ") {
			t.Errorf("network with nat44 false masquerades what leaves it: %q", r)
		}
	}
}

func TestRestartAndReservation(t *testing.T) {
	needRoot(t)
	host := testutil.NewNS(t, "sticky-host")
	n := testNet("sticky", api.ModeHost, "10.200.4.0/24")
	n.Reservations = []api.Reservation{{MAC: "52:55:55:00:04:99", IP: netip.MustParseAddr("10.200.4.77")}}
	state := t.TempDir()
	nw := start(t, host, n, Options{StateDir: state})
	a := vm(t, host, "a", "52:55:55:00:04:01", n.Bridge(), false)
	first := mustUdhcpc(t, a, "")["ip"]
	if err := nw.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(LeaseFile(state, n.ID)); err != nil {
		t.Fatalf("no lease file: %v", err)
	}

	nw = start(t, host, n, Options{StateDir: state})
	// A new VM asks first: it must not get a's address.
	b := vm(t, host, "b", "52:55:55:00:04:02", n.Bridge(), false)
	if got := mustUdhcpc(t, b, "")["ip"]; got == first {
		t.Errorf("after a restart a new MAC got %s, the address of another", got)
	}
	if got := mustUdhcpc(t, a, "")["ip"]; got != first {
		t.Errorf("after a restart the same MAC got %s, want %s", got, first)
	}
	r := vm(t, host, "r", "52:55:55:00:04:99", n.Bridge(), false)
	if got := mustUdhcpc(t, r, "")["ip"]; got != "10.200.4.77" {
		t.Errorf("reserved MAC got %s, want 10.200.4.77", got)
	}
	// A fixed address set at run time.
	c := vm(t, host, "c", "52:55:55:00:04:03", n.Bridge(), false)
	if err := nw.SetHost(mustMAC("52:55:55:00:04:03"), "c", netip.MustParseAddr("10.200.4.250")); err != nil {
		t.Fatal(err)
	}
	if got := mustUdhcpc(t, c, "")["ip"]; got != "10.200.4.250" {
		t.Errorf("fixed MAC got %s, want 10.200.4.250", got)
	}
}

func TestBridged(t *testing.T) {
	needRoot(t)
	host, lan := testutil.NewNS(t, "br-host"), testutil.NewNS(t, "br-lan")

	// The LAN: a DHCP server (busybox udhcpd) behind the host bridge lanbr.
	host.MustRun(t, "ip", "link", "add", "lanbr", "up", "type", "bridge")
	veth(t, host, "lan0", lan, "")
	host.MustRun(t, "ip", "link", "set", "lan0", "master", "lanbr")
	lan.DHCPServer(t, "eth0", "10.77.0.1/24", "10.77.0.100", "10.77.0.150")

	n := &api.Network{ID: "br", Name: "br", Mode: api.ModeBridged, Interface: "lanbr", MTU: 1500}
	nw := start(t, host, n, Options{})
	if s := nw.Stats(nettypes.StatsQuery{}); s.DHCP.Requests != nil {
		t.Errorf("a bridged network runs a DHCP server: %+v", s)
	}
	var bridge string
	host.MustDo(t, func() (err error) { bridge, err = PortBridge(n); return err })
	if bridge != "lanbr" {
		t.Fatalf("PortBridge = %q, want lanbr", bridge)
	}
	v := vm(t, host, "vm1", "52:55:55:00:05:01", bridge, false)
	// udhcpd answers its first DISCOVER only once it is up: retry.
	var l map[string]string
	testutil.Eventually(t, 20*time.Second, func() (err error) { l, err = v.DHCP(t, "eth0"); return err }, "lease from the LAN")
	// udhcpd leases 10.77.0.100-150: the address must be one of those.
	if err := testutil.InRange(l["ip"], "10.77.0.100", "10.77.0.150"); err != nil || l["router"] != "10.77.0.1" {
		t.Errorf("lease from the LAN: %v (%v)", l, err)
	}
	if err := v.Ping("10.77.0.1", 1); err != nil {
		t.Errorf("VM cannot ping the LAN: %v", err)
	}

	t.Run("Macvtap", func(t *testing.T) {
		m := &api.Network{ID: "mv", Name: "mv", Mode: api.ModeBridged, Interface: "uplink0", MTU: 1500}
		other := testutil.NewNS(t, "br-other")
		veth(t, host, "uplink0", other, "")
		host.MustDo(t, func() error {
			if err := Ensure(context.Background(), m); err != nil {
				return err
			}
			if b, err := PortBridge(m); err != nil || b != "" {
				return fmt.Errorf("PortBridge of a non-bridge interface = %q, %v; want \"\"", b, err)
			}
			mac := mustMAC("52:55:55:00:05:02")
			for range 2 { // idempotent
				mv, err := CreateMacvtap(m, "mvt-vm1", mac)
				if err != nil {
					return err
				}
				parent, _ := netlink.LinkByName("uplink0")
				if mv.Mode != netlink.MACVLAN_MODE_BRIDGE || mv.Attrs().ParentIndex != parent.Attrs().Index ||
					mv.Attrs().HardwareAddr.String() != mac.String() || mv.Attrs().Alias != hostnet.Mark("mv") {
					return fmt.Errorf("macvtap %+v", mv)
				}
			}
			if err := Remove(context.Background(), "mv", ""); err != nil {
				return err
			}
			if _, err := netlink.LinkByName("mvt-vm1"); !hostnet.NotFound(err) {
				return fmt.Errorf("macvtap survived Remove: %v", err)
			}
			if _, err := netlink.LinkByName("uplink0"); err != nil {
				return fmt.Errorf("Remove deleted the interface: %v", err)
			}
			return nil
		})
	})
}

func TestRemoveAndSweep(t *testing.T) {
	needRoot(t)
	host := testutil.NewNS(t, "sweep-host")
	before := snapshot(t, host)
	state := t.TempDir()
	a := testNet("a", api.ModeShared, "10.200.6.0/24")
	b := testNet("b", api.ModeHost, "10.200.7.0/24")
	nwA := start(t, host, a, Options{StateDir: state})
	nwB := start(t, host, b, Options{StateDir: state})
	v := vm(t, host, "vm1", "52:55:55:00:06:01", b.Bridge(), false)
	mustUdhcpc(t, v, "")
	nwA.Close()
	nwB.Close()
	host.MustRun(t, "ip", "link", "del", "p-vm1")
	if _, err := os.Stat(LeaseFile(state, "b")); err != nil {
		t.Fatal(err)
	}
	// A journal left beside it (Close compacts it away; a crash does not).
	if err := os.WriteFile(leases.JournalPath(LeaseFile(state, "b")), nil, 0o600); err != nil {
		t.Fatal(err)
	}

	var removed []string
	host.MustDo(t, func() (err error) { removed, err = Sweep(context.Background(), []string{"a"}, state); return err })
	if fmt.Sprint(removed) != "[b]" {
		t.Errorf("Sweep removed %v, want [b]", removed)
	}
	for _, f := range []string{LeaseFile(state, "b"), leases.JournalPath(LeaseFile(state, "b"))} {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("lease file %s of b survived Sweep: %v", f, err)
		}
	}
	var s *State
	host.MustDo(t, func() (err error) { s, err = Inspect(context.Background(), "a"); return err })
	if s.Bridge == "" || s.Table == "" {
		t.Errorf("Sweep removed the kept network a: %+v", s)
	}
	for range 2 {
		host.MustDo(t, func() error { return Remove(context.Background(), "a", state) })
	}
	var err error
	host.Do(func() error { err = Check(context.Background(), a); return nil })
	if err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("Check after Remove: %v", err)
	}
	if after := snapshot(t, host); after != before {
		t.Errorf("Remove left the host changed:\n%s", lineDiff(before, after))
	}
}

func TestConflicts(t *testing.T) {
	needRoot(t)
	host, other := testutil.NewNS(t, "conflict-host"), testutil.NewNS(t, "conflict-other")
	veth(t, host, "taken", other, "")
	host.MustRun(t, "ip", "addr", "add", "10.201.0.1/24", "dev", "taken")
	host.MustRun(t, "ip", "route", "add", "10.202.0.0/16", "dev", "taken")
	// A foreign bridge of the name vmnetctl would use, and a foreign table.
	host.MustRun(t, "ip", "link", "add", api.BridgeName("squat"), "type", "bridge")
	host.MustRun(t, "nft", "add", "table", "inet", hostnet.TableName("tbl"))
	first := testNet("first", api.ModeShared, "10.205.0.0/24")
	host.MustDo(t, func() error { return Ensure(context.Background(), first) })
	before := snapshot(t, host)
	for _, tc := range []struct {
		n    *api.Network
		want string
	}{
		{testNet("addr", api.ModeShared, "10.201.0.0/16"), "overlaps the address 10.201.0.1/24 of taken"},
		{testNet("route", api.ModeHost, "10.202.5.0/24"), "overlaps the route to 10.202.0.0/16"},
		{testNet("squat", api.ModeShared, "10.203.0.0/24"), "is not this network's"},
		{testNet("tbl", api.ModeShared, "10.204.0.0/24"), "is not vmnetctl's"},
		{&api.Network{ID: "nic", Mode: api.ModeBridged, Interface: "nosuch0"}, "interface nosuch0 does not exist"},
		{testNet("second", api.ModeHost, "10.205.0.0/25"), `vmn-first, the bridge of network "first"`},
	} {
		var err error
		host.Do(func() error { err = Ensure(context.Background(), tc.n); return nil })
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Ensure(%s) = %v, want an error containing %q", tc.n.ID, err, tc.want)
		}
	}
	// Refusing changed nothing, and Remove leaves foreign objects alone.
	for _, id := range []string{"squat", "tbl"} {
		host.MustDo(t, func() error { return Remove(context.Background(), id, "") })
	}
	if after := snapshot(t, host); after != before {
		t.Errorf("refused Ensure or Remove changed the host:\n%s", lineDiff(before, after))
	}
}

// TestLeasesRebuiltFromGuard: a network whose lease file cannot be read
// starts (the file set aside), and a VM the guard lets use an address
// keeps it as a lease, with an event saying the leases were rebuilt
// (issue 32: "leases rebuilt from what the kernel and the guard know").
func TestLeasesRebuiltFromGuard(t *testing.T) {
	needRoot(t)
	host := testutil.NewNS(t, "lr-host")
	n := testNet("lr", api.ModeShared, "10.200.61.0/24")
	state := t.TempDir()
	var events []string
	opts := Options{StateDir: state, Upstreams: []string{"127.0.0.1:53"},
		OnLease: func(kind, network, _ string, _ netip.Addr) { events = append(events, kind+" "+network) }}
	nw := start(t, host, n, opts)
	mac, ip := mustMAC("52:55:55:00:61:01"), netip.MustParseAddr("10.200.61.77")
	host.MustDo(t, func() error { return guard.BindAddress(context.Background(), n, mac, ip) })
	nw.Close()
	if err := os.WriteFile(LeaseFile(state, n.ID), []byte(`{"network": "lr", "leases": [`), 0o644); err != nil {
		t.Fatal(err)
	}
	nw = start(t, host, n, opts)
	if l, ok := nw.alloc.Lookup(mac); !ok || l.IP != ip {
		t.Errorf("after the lease file was set aside, %s's lease is %+v, %v; want %s, from the guard", mac, l, ok, ip)
	}
	if _, err := os.Stat(LeaseFile(state, n.ID) + ".unreadable"); err != nil {
		t.Errorf("the unreadable lease file was not set aside: %v", err)
	}
	if !slices.Contains(events, "leases-rebuilt lr") {
		t.Errorf("events %v, want leases-rebuilt for lr", events)
	}
}
