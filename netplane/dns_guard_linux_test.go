package netplane

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/dnsproxy"
	"github.com/vmnetctl/vmnetctl/nettypes"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// The DNS proxy against hostile neighbours and guests (issue 22): it
// answers only what comes in on its bridge or from the host itself, keeps
// a host-only network's names inside, lets no DHCP host name take a VM
// file's name, and stays bounded under a flood.

// TestDNSOnlyFromBridge: a LAN neighbour with a route to the gateway
// address (the WAN namespace routes the lab subnets to the host's uplink)
// reaches the gateway, but its DNS queries get no answer, over UDP or TCP;
// the same queries from a VM on the bridge, and from the host, are
// answered.
func TestDNSOnlyFromBridge(t *testing.T) {
	needRoot(t)
	host := testutil.NewNS(t, "dg-host")
	lan := wan(t, host) // the neighbour: 10.200.0.0/16 via the host's uplink
	wanDNS(t, lan)
	n := testNet("dg1", api.ModeShared, "10.200.21.0/24")
	nw := start(t, host, n, Options{Upstreams: []string{wanPeer + ":53"}})
	v := vm(t, host, "vm1", "52:55:55:00:21:01", n.Bridge(), false)
	addr := checkLease(t, n, mustUdhcpc(t, v, ""), n.Gateway.String())
	if err := nw.SetHost(mustMAC("52:55:55:00:21:01"), "vm1", netip.Addr{}); err != nil {
		t.Fatal(err)
	}
	gw := n.Gateway.String()

	type probe struct{ name, want string }
	probes := []probe{{"vm1.vmnet.internal", addr.String()}, {"example.test", "192.0.2.7"}}
	for _, from := range []struct {
		label string
		ns    *testutil.NS
	}{{"the VM on the bridge", v}, {"the host", host}} {
		for _, p := range probes {
			for _, proto := range []string{"udp", "tcp"} {
				resp, err := query(from.ns, gw, p.name, dns.TypeA, proto)
				if err != nil {
					t.Errorf("%s: %s over %s: %v", from.label, p.name, proto, err)
				} else if got := answerA(resp); got != p.want {
					t.Errorf("%s: %s over %s: answer %q, want %q", from.label, p.name, proto, got, p.want)
				}
			}
		}
	}

	// The neighbour does reach the gateway address: the silence below is
	// the proxy's, not the route's.
	if err := lan.Ping(gw, 1); err != nil {
		t.Fatalf("the LAN neighbour cannot ping the gateway %s (so no answer would prove nothing): %v", gw, err)
	}
	before := nw.Stats(nettypes.StatsQuery{}).DNS.Queries
	for _, p := range probes {
		for _, proto := range []string{"udp", "tcp"} {
			if resp, err := query(lan, gw, p.name, dns.TypeA, proto); err == nil {
				t.Errorf("the LAN neighbour got an answer to %s over %s: %v", p.name, proto, resp)
			}
		}
	}
	if after := nw.Stats(nettypes.StatsQuery{}).DNS.Queries; after != before {
		t.Errorf("the proxy saw %d queries from outside the bridge", after-before)
	}
}

// TestDNSHostOnly: a host network's proxy answers its VMs' names and
// refuses every other name, so a VM cannot tunnel names out through it;
// with dnsForward: true it forwards them.
func TestDNSHostOnly(t *testing.T) {
	needRoot(t)
	host := testutil.NewNS(t, "dh-host")
	w := wan(t, host)
	wanDNS(t, w)
	on := true
	for _, tc := range []struct {
		id, subnet, mac string
		forward         *bool
	}{
		{"dh1", "10.200.22.0/24", "52:55:55:00:22:01", nil}, // the default: no forwarding
		{"dh2", "10.200.23.0/24", "52:55:55:00:23:01", &on},
	} {
		t.Run(tc.id, func(t *testing.T) {
			n := testNet(tc.id, api.ModeHost, tc.subnet)
			n.DNSForward = tc.forward
			nw := start(t, host, n, Options{Upstreams: []string{wanPeer + ":53"}})
			v := vm(t, host, "vm-"+tc.id, tc.mac, n.Bridge(), false)
			addr := checkLease(t, n, mustUdhcpc(t, v, ""), n.Gateway.String())
			if err := nw.SetHost(mustMAC(tc.mac), "vm1", netip.Addr{}); err != nil {
				t.Fatal(err)
			}
			gw := n.Gateway.String()
			for _, name := range []string{"vm1.vmnet.internal", "vm1"} {
				resp, err := query(v, gw, name, dns.TypeA, "udp")
				if err != nil || answerA(resp) != addr.String() {
					t.Errorf("%s: %v %v, want %s", name, resp, err, addr)
				}
			}
			for _, proto := range []string{"udp", "tcp"} {
				resp, err := query(v, gw, "example.test", dns.TypeA, proto)
				switch {
				case err != nil:
					t.Errorf("example.test over %s: %v", proto, err)
				case tc.forward == nil && (resp.Rcode != dns.RcodeRefused || len(resp.Answer) != 0):
					t.Errorf("example.test over %s on a host network: %v, want REFUSED", proto, resp)
				case tc.forward != nil && answerA(resp) != "192.0.2.7":
					t.Errorf("example.test over %s with dnsForward: %v, want 192.0.2.7", proto, resp)
				}
			}
			s := nw.Stats(nettypes.StatsQuery{}).DNS
			if tc.forward == nil && (s.Refused < 2 || s.Forwarded != 0) {
				t.Errorf("DNS stats %+v, want 2 refused and nothing forwarded", s)
			}
			if tc.forward != nil && (s.Refused != 0 || s.Forwarded < 2) {
				t.Errorf("DNS stats %+v, want 2 forwarded and nothing refused", s)
			}
		})
	}
}

// TestDNSHostnameCannotTakeVMName: a guest sending the DHCP host name "db"
// gets that name while nobody else has it, loses it the moment a VM file
// names a VM "db" (even one that is not running), and the VM "db" gets it
// when it comes up.
func TestDNSHostnameCannotTakeVMName(t *testing.T) {
	needRoot(t)
	host := testutil.NewNS(t, "dn-host")
	n := testNet("dn1", api.ModeShared, "10.200.25.0/24")
	nw := start(t, host, n, Options{Upstreams: []string{"192.0.2.53:53"}})
	const attackerMAC, dbMAC = "52:55:55:00:25:01", "52:55:55:00:25:02"
	attacker := vm(t, host, "attacker", attackerMAC, n.Bridge(), false)
	evil := checkLease(t, n, mustUdhcpc(t, attacker, "db"), n.Gateway.String())
	gw := n.Gateway.String()
	lookup := func(name string) (*dns.Msg, error) { return query(attacker, gw, name, dns.TypeA, "udp") }

	// The control: a DHCP host name is served while no VM file has it.
	if resp, err := lookup("db.vmnet.internal"); err != nil || answerA(resp) != evil.String() {
		t.Fatalf("the DHCP host name db: %v %v, want %s (so the checks below would prove nothing)", resp, err, evil)
	}

	// A VM file defines db; db is not running.
	if err := nw.SetHost(mustMAC(dbMAC), "db", netip.Addr{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"db.vmnet.internal", "DB.vmnet.internal"} {
		resp, err := lookup(name)
		if err != nil || resp.Rcode != dns.RcodeNameError || len(resp.Answer) != 0 {
			t.Errorf("%s while the VM db is down: %v %v, want NXDOMAIN (not the guest that sent the host name)", name, resp, err)
		}
	}
	// A bare name is not forwarded either (the upstream does not exist:
	// that would be SERVFAIL), nor answered with the guest's address.
	if resp, err := lookup("db"); err != nil || answerA(resp) != "" {
		t.Errorf("db while the VM db is down: %v %v, want no answer", resp, err)
	}

	// db comes up: the name is its own, even after the guest renews with
	// the host name db again.
	db := vm(t, host, "db", dbMAC, n.Bridge(), false)
	dbAddr := checkLease(t, n, mustUdhcpc(t, db, ""), n.Gateway.String())
	mustUdhcpc(t, attacker, "db")
	for _, name := range []string{"db.vmnet.internal", "db"} {
		if resp, err := lookup(name); err != nil || answerA(resp) != dbAddr.String() {
			t.Errorf("%s with the VM db up: %v %v, want %s", name, resp, err, dbAddr)
		}
	}
}

// openFDs counts the process's open file descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestDNSFloodBounded: a VM floods the proxy with names to forward while
// the upstream never answers. The goroutines and file descriptors of the
// process stay within the proxy's bound of queries in flight (not one per
// query), the excess is counted as dropped, and when the flood ends they
// come back down. Excess TCP connections are closed and counted too.
func TestDNSFloodBounded(t *testing.T) {
	needRoot(t)
	host := testutil.NewNS(t, "df-host")
	// The silent upstream: a socket in the host that never reads.
	var silent net.PacketConn
	host.MustDo(t, func() (err error) { silent, err = net.ListenPacket("udp4", "127.0.0.1:0"); return err })
	t.Cleanup(func() { silent.Close() })
	n := testNet("df1", api.ModeShared, "10.200.24.0/24")
	nw := start(t, host, n, Options{Upstreams: []string{silent.LocalAddr().String()}})
	v := vm(t, host, "flood", "52:55:55:00:24:01", n.Bridge(), false)
	v.MustRun(t, "ip", "addr", "add", "10.200.24.50/24", "dev", "eth0")
	gw := net.JoinHostPort(n.Gateway.String(), "53")

	runtime.GC()
	g0, fd0 := runtime.NumGoroutine(), openFDs(t)
	// The bound: dnsproxy.MaxInFlight forwarding goroutines and upstream sockets,
	// plus room for what else runs (the sender, miekg/dns's goroutines
	// that are about to drop a query, the pooled connections' dials).
	// Written out, not maxUDPHandlers and dnsproxy.MaxInFlight, so that raising
	// those (unbounding the proxy) makes this test fail.
	const slack = 40
	const boundG, boundFD = 2*64 + slack, 64 + slack
	maxG, maxFD := g0, fd0
	sample := func() {
		maxG = max(maxG, runtime.NumGoroutine())
		maxFD = max(maxFD, openFDs(t))
	}

	const queries = 3000
	var conn net.Conn
	v.MustDo(t, func() (err error) { conn, err = net.Dial("udp4", gw); return err })
	t.Cleanup(func() { conn.Close() })
	deadline := time.Now().Add(10 * time.Second)
	for i := range queries {
		m := new(dns.Msg)
		m.SetQuestion(fmt.Sprintf("q%d.flood.test.", i), dns.TypeA)
		b, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Write(b); err != nil {
			t.Fatalf("query %d: %v", i, err)
		}
		if i%50 == 0 {
			sample()
		}
		if time.Now().After(deadline) {
			t.Fatalf("sent only %d queries in 10s", i)
		}
	}
	// Poll, not Eventually: the bounds below are checked either way.
	if err := testutil.Poll(5*time.Second, func() error {
		sample()
		// The kernel drops some of the flood itself when the socket's
		// buffer is full; of what the proxy read, all but the queries in
		// flight (the upstream answers none within the test) are dropped.
		if s := nw.Stats(nettypes.StatsQuery{}).DNS; s.Queries < queries/10 || s.Dropped == 0 || s.Queries-s.Dropped > dnsproxy.MaxInFlight {
			return fmt.Errorf("DNS stats %+v, want all but %d of the queries read dropped", s, dnsproxy.MaxInFlight)
		}
		return nil
	}); err != nil {
		t.Errorf("the proxy drops what exceeds its bound: %v", err)
	}
	sample()
	if maxG > g0+boundG {
		t.Errorf("goroutines rose from %d to %d under the flood, want at most %d more", g0, maxG, boundG)
	}
	if maxFD > fd0+boundFD {
		t.Errorf("open fds rose from %d to %d under the flood, want at most %d more", fd0, maxFD, boundFD)
	}
	// The queries in flight time out (dnsproxy.UpstreamTimeout) and their goroutines
	// end; the pooled upstream sockets stay, within the bound.
	testutil.Eventually(t, 3*dnsproxy.UpstreamTimeout, func() error {
		if g := runtime.NumGoroutine(); g > g0+slack {
			return fmt.Errorf("%d goroutines, %d before the flood", g, g0)
		}
		if fd := openFDs(t); fd > fd0+boundFD {
			return fmt.Errorf("%d open fds, %d before the flood", fd, fd0)
		}
		return nil
	}, "the goroutines and fds of the flood end")
	t.Logf("flood of %d: goroutines %d → peak %d, fds %d → peak %d; %+v", queries, g0, maxG, fd0, maxFD, nw.Stats(nettypes.StatsQuery{}).DNS)

	t.Run("TCP queries", func(t *testing.T) {
		// One connection answers dnsproxy.MaxTCPQueries queries (names of the
		// network's own domain: answered locally), then is closed.
		var c *dns.Conn
		v.MustDo(t, func() (err error) { c, err = dns.DialTimeout("tcp4", gw, 2*time.Second); return err })
		defer c.Close()
		answered := 0
		for i := range dnsproxy.MaxTCPQueries + 1 {
			m := new(dns.Msg)
			m.SetQuestion(fmt.Sprintf("nobody%d.%s.", i, dnsproxy.Domain), dns.TypeA)
			c.SetDeadline(time.Now().Add(2 * time.Second))
			if err := c.WriteMsg(m); err != nil {
				break
			}
			if _, err := c.ReadMsg(); err != nil {
				break
			}
			answered++
		}
		if answered != dnsproxy.MaxTCPQueries {
			t.Errorf("one TCP connection got %d answers, want %d and then closed", answered, dnsproxy.MaxTCPQueries)
		}
	})
	t.Run("TCP", func(t *testing.T) {
		dropped := nw.Stats(nettypes.StatsQuery{}).DNS.Dropped
		const conns = dnsproxy.MaxTCPConns + 8
		var held []net.Conn
		t.Cleanup(func() {
			for _, c := range held {
				c.Close()
			}
		})
		v.MustDo(t, func() error {
			for range conns {
				c, err := (&net.Dialer{Timeout: 2 * time.Second}).DialContext(context.Background(), "tcp4", gw)
				if err != nil {
					return err
				}
				held = append(held, c)
			}
			return nil
		})
		testutil.Eventually(t, 5*time.Second, func() error {
			if got := nw.Stats(nettypes.StatsQuery{}).DNS.Dropped - dropped; got < conns-dnsproxy.MaxTCPConns {
				return fmt.Errorf("%d connections dropped, want %d", got, conns-dnsproxy.MaxTCPConns)
			}
			return nil
		}, "connections beyond %d are closed", dnsproxy.MaxTCPConns)
	})
}
