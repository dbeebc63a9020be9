package routeradv

import (
	"bytes"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mdlayher/ndp"
	"github.com/vishvananda/netlink"
	"github.com/vmnetctl/vmnetctl/test/testutil"
	"golang.org/x/net/ipv6"
)

// The router advertisement tests join a "router" namespace, where startRA
// runs on rt0, and a "vm" namespace, whose eth0 configures itself from the
// RAs as a guest does (SLAAC), by a veth pair. No packet leaves them.

var raPrefix = netip.MustParsePrefix("fd00:1234:5678:9abc::/64")

// mustDo runs f in namespace n and fails the test on error. f must not
// call t.Fatal: it runs on another goroutine.
func mustDo(t *testing.T, n *testutil.NS, f func() error) {
	t.Helper()
	if err := n.Do(f); err != nil {
		t.Fatalf("in %s: %v", n, err)
	}
}

// raLab is a router namespace and a VM namespace joined by rt0 (router) and
// eth0 (VM), both down.
type raLab struct{ router, vm *testutil.NS }

func newRALab(t *testing.T) *raLab {
	t.Helper()
	l := &raLab{router: testutil.NewNS(t, "ra-router"), vm: testutil.NewNS(t, "ra-vm")}
	testutil.Run(t, "ip", "-n", l.router.Name, "link", "add", "rt0", "type", "veth", "peer", "name", "eth0", "netns", l.vm.Name)
	// A guest that takes RAs, quickly: no DAD.
	mustDo(t, l.vm, func() error {
		return ipv6Sysctls("eth0", "accept_ra", "1", "autoconf", "1", "accept_dad", "0", "forwarding", "0")
	})
	return l
}

// up brings both ends up, the router's as the caller of startRA must set
// it: no DAD, which would not end on a bridge without carrier, and no RAs
// taken, since its own loop back to it.
func (l *raLab) up(t *testing.T) {
	t.Helper()
	mustDo(t, l.router, func() error { return ipv6Sysctls("rt0", "accept_dad", "0", "accept_ra", "0") })
	l.router.MustRun(t, "ip", "link", "set", "rt0", "up")
	l.vm.MustRun(t, "ip", "link", "set", "eth0", "up")
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

// startRAIn starts cfg in namespace n and closes it at cleanup.
func startRAIn(t *testing.T, n *testutil.NS, cfg Config) *Server {
	t.Helper()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	var s *Server
	mustDo(t, n, func() error {
		var err error
		s, err = Start(cfg, log)
		return err
	})
	t.Cleanup(func() { s.Close() })
	return s
}

// vmState is what the VM's eth0 got from the RAs.
type vmState struct {
	addr netip.Addr // a global address in raPrefix, if any
	gw   netip.Addr // the default route's gateway, if any
	mtu  string     // eth0's IPv6 MTU
}

func (l *raLab) vmState(t *testing.T) vmState {
	t.Helper()
	var st vmState
	mustDo(t, l.vm, func() error {
		link, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		addrs, err := netlink.AddrList(link, netlink.FAMILY_V6)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP); ok && raPrefix.Contains(ip) {
				st.addr = ip
			}
		}
		routes, err := netlink.RouteList(link, netlink.FAMILY_V6)
		if err != nil {
			return err
		}
		for _, r := range routes {
			if ones, _ := r.Dst.Mask.Size(); r.Gw != nil && (r.Dst == nil || ones == 0) {
				st.gw, _ = netip.AddrFromSlice(r.Gw)
			}
		}
		mtu, err := os.ReadFile("/proc/sys/net/ipv6/conf/eth0/mtu")
		st.mtu = string(bytes.TrimSpace(mtu))
		return err
	})
	return st
}

// raClient is an NDP socket on the VM's eth0 that reads RAs only.
func raClient(t *testing.T, vm *testutil.NS) (*ndp.Conn, net.HardwareAddr) {
	t.Helper()
	var c *ndp.Conn
	var mac net.HardwareAddr
	mustDo(t, vm, func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		mac = ifi.HardwareAddr
		if c, _, err = ndpClient(ifi); err != nil {
			return err
		}
		var f ipv6.ICMPFilter
		f.SetAll(true)
		f.Accept(ipv6.ICMPTypeRouterAdvertisement)
		return c.SetICMPFilter(&f)
	})
	t.Cleanup(func() { c.Close() })
	return c, mac
}

// ndpClient is ndp.Listen(ifi, ndp.LinkLocal) with ifi's index as its
// name, and then none: ndp names its interface's name as the zone of what
// it sends to, which Go resolves through a process-wide cache of whichever
// network namespace last refreshed it (the test works in several); an
// index resolves to itself, and with no name the control message's index
// picks the link.
func ndpClient(ifi *net.Interface) (*ndp.Conn, netip.Addr, error) {
	byIndex := &net.Interface{Index: ifi.Index, MTU: ifi.MTU, Name: strconv.Itoa(ifi.Index), HardwareAddr: ifi.HardwareAddr, Flags: ifi.Flags}
	c, addr, err := ndp.Listen(byIndex, ndp.LinkLocal)
	byIndex.Name = ""
	return c, addr.WithZone(""), err
}

// readRA returns the next RA c reads from src within timeout.
func readRA(c *ndp.Conn, src netip.Addr, timeout time.Duration) (*ndp.RouterAdvertisement, error) {
	if err := c.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return nil, err
	}
	for {
		m, _, from, err := c.ReadFrom()
		if err != nil {
			return nil, err
		}
		if ra, ok := m.(*ndp.RouterAdvertisement); ok && from.WithZone("") == src {
			return ra, nil
		}
	}
}

func TestRouterAdvertisements(t *testing.T) {
	testutil.RequireRoot(t, "creates network namespaces")
	l := newRALab(t)
	l.up(t)
	cfg := Config{
		Iface: "rt0", Prefix: raPrefix, RouterLifetime: 30 * time.Minute, MTU: 1400,
		RDNSS: []netip.Addr{netip.MustParseAddr("fd00:1234:5678:9abc::1")}, DNSSL: []string{"vmnet.internal"},
	}
	s := startRAIn(t, l.router, cfg)
	if !s.addr.IsLinkLocalUnicast() {
		t.Fatalf("RAs sent from %s, want a link-local address", s.addr)
	}
	router := s.addr

	t.Run("SLAAC", func(t *testing.T) {
		var st vmState
		testutil.Eventually(t, 10*time.Second, func() error {
			st = l.vmState(t)
			if !st.addr.IsValid() || st.gw != router || st.mtu != "1400" {
				return fmt.Errorf("VM has address %v, default route via %v, MTU %s", st.addr, st.gw, st.mtu)
			}
			return nil
		}, "the VM to configure itself from the RAs")
		t.Logf("VM: %s, default via %s, MTU %s", st.addr, st.gw, st.mtu)
		// accept_ra 0: the router does not take its own RAs, which loop back.
		if out := l.router.MustRun(t, "ip", "-6", "addr", "show", "dev", "rt0"); strings.Contains(out, "fd00:1234:") {
			t.Errorf("the router configured itself from its own RAs:\n%s", out)
		}
	})

	c, vmMAC := raClient(t, l.vm)
	rs := &ndp.RouterSolicitation{Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: vmMAC}}}

	t.Run("Options", func(t *testing.T) {
		_, sol0, _ := s.Stats()
		if err := c.WriteTo(rs, nil, allRouters); err != nil {
			t.Fatal(err)
		}
		ra, err := readRA(c, router, 5*time.Second)
		if err != nil {
			t.Fatalf("no RA after a solicitation: %v", err)
		}
		if _, sol, _ := s.Stats(); sol <= sol0 {
			t.Errorf("solicitations received: %d, was %d", sol, sol0)
		}
		checkRA(t, ra, cfg, l.routerMAC(t))
	})

	t.Run("Forwarded", func(t *testing.T) {
		// A solicitation whose hop limit is not 255 came from off the
		// link: not one to answer (RFC 4861 6.1.1).
		_, sol0, _ := s.Stats()
		ign0 := s.ignored.Load()
		if err := c.WriteTo(rs, &ipv6.ControlMessage{HopLimit: 64}, allRouters); err != nil {
			t.Fatal(err)
		}
		if err := c.WriteTo(rs, nil, allRouters); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 5*time.Second, func() bool { _, sol, _ := s.Stats(); return sol+s.ignored.Load() >= sol0+ign0+2 },
			"the server to read both solicitations")
		if _, sol, _ := s.Stats(); sol != sol0+1 || s.ignored.Load() != ign0+1 {
			t.Errorf("%d solicitations counted, %d ignored; want 1 and 1 (one had hop limit 64)", sol-sol0, s.ignored.Load()-ign0)
		}
	})

	t.Run("RateLimit", func(t *testing.T) {
		// Quiet: every solicitation so far is answered or counted limited.
		quiet := func() error {
			_, sol, lim := s.Stats()
			if rep := s.replies.Load(); rep+lim != sol {
				return fmt.Errorf("%d solicitations, %d replies, %d limited", sol, rep, lim)
			}
			return nil
		}
		testutil.Eventually(t, 5*time.Second, quiet, "the replies to the solicitations so far")
		_, sol0, lim0 := s.Stats()
		rep0 := s.replies.Load()
		const flood = 200
		start := time.Now()
		for range flood {
			if err := c.WriteTo(rs, nil, allRouters); err != nil {
				t.Fatal(err)
			}
		}
		testutil.Eventually(t, 5*time.Second, func() bool { _, sol, _ := s.Stats(); return sol-sol0 >= flood },
			"the server to read the %d solicitations", flood)
		testutil.Eventually(t, 5*time.Second, quiet, "the replies to the flood")
		elapsed := time.Since(start)
		_, sol, lim := s.Stats()
		rep := s.replies.Load() - rep0
		// One reply at once, then one per raReplyInterval; one more may have
		// been under way.
		if limit := 2 + uint64(elapsed/raReplyInterval); rep < 1 || rep > limit {
			t.Errorf("%d replies to %d solicitations in %v, want 1 to %d", rep, sol-sol0, elapsed, limit)
		}
		if lim-lim0 < flood-rep {
			t.Errorf("limited counted %d of the flood of %d with %d replies", lim-lim0, flood, rep)
		}
		t.Logf("flood of %d: %d replies, %d limited in %v", sol-sol0, rep, lim-lim0, elapsed)
	})

	t.Run("Close", func(t *testing.T) {
		// Its sender and its reader run (what the count after Close must
		// not find).
		if n := testutil.Goroutines("routeradv.(*Server)"); n != 2 {
			t.Errorf("%d goroutines of the running server, want 2", n)
		}
		sent, _, _ := s.Stats()
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := s.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
		if after, _, _ := s.Stats(); after != sent {
			t.Errorf("Close sent %d RAs, want none (a restart must not withdraw the router)", after-sent)
		}
		testutil.Eventually(t, 5*time.Second, func() error {
			if n := testutil.Goroutines("routeradv.(*Server)"); n != 0 {
				return fmt.Errorf("%d goroutines of the server left", n)
			}
			return nil
		}, "the server's goroutines to end")
		// No final RA: the VM keeps its default route (through a restart).
		if gw := l.vmState(t).gw; !gw.IsValid() {
			t.Errorf("the VM lost its default route when the server closed")
		}
	})

	t.Run("HostOnly", func(t *testing.T) {
		l := newRALab(t)
		l.up(t)
		s := startRAIn(t, l.router, Config{Iface: "rt0", Prefix: raPrefix})
		var st vmState
		testutil.Eventually(t, 10*time.Second, func() bool { st = l.vmState(t); return st.addr.IsValid() },
			"a SLAAC address on the VM")
		// The kernel takes the router lifetime before the prefix, from the
		// same RA: no default route now means none to come.
		if st.gw.IsValid() {
			t.Errorf("default route via %s from RAs with router lifetime 0", st.gw)
		}
		if st.mtu != "1500" {
			t.Errorf("MTU %s without an MTU option, want 1500", st.mtu)
		}
		// Losing carrier takes the router's link-local address away for a
		// while, and sends fail: the server keeps going, and the VM, whose
		// address went with its link, gets one again once it is back.
		l.vm.MustRun(t, "ip", "link", "set", "eth0", "down")
		testutil.Eventually(t, 5*time.Second, func() bool { return !l.vmState(t).addr.IsValid() }, "the VM's address to go")
		l.vm.MustRun(t, "ip", "link", "set", "eth0", "up")
		testutil.Eventually(t, 10*time.Second, func() bool { return l.vmState(t).addr.IsValid() },
			"a SLAAC address on the VM after the link came back")
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})

	t.Run("LinkLocal", func(t *testing.T) {
		// rt0 without carrier (eth0 down) has no link-local address: the
		// server waits for it, and fails with a clear error at the deadline.
		l := newRALab(t)
		l.router.MustRun(t, "ip", "link", "set", "rt0", "up")
		var err error
		l.router.Do(func() error { _, _, _, err = listenNDP("rt0", 200*time.Millisecond); return nil })
		if err == nil || !strings.Contains(err.Error(), "no carrier") {
			t.Errorf("listening on rt0 without carrier: %v, want an error saying no carrier", err)
		}
		// With carrier, the address is tentative for DAD's second (accept_dad
		// is 1): the server waits it out.
		done := make(chan error, 1)
		go func() {
			done <- l.router.Do(func() error {
				c, _, _, err := listenNDP("rt0", raLinkLocalWait)
				if err == nil {
					c.Close()
				}
				return err
			})
		}()
		l.vm.MustRun(t, "ip", "link", "set", "eth0", "up")
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("listening on rt0 while DAD runs: %v", err)
			}
		case <-time.After(2 * raLinkLocalWait):
			t.Fatal("listenNDP did not return")
		}
	})

	t.Run("Config", func(t *testing.T) {
		for _, c := range []Config{
			{Iface: "rt0", Prefix: netip.MustParsePrefix("fd00::/48")},
			{Iface: "rt0", Prefix: netip.MustParsePrefix("10.0.0.0/24")},
			{Iface: "rt0", Prefix: raPrefix, RouterLifetime: time.Minute},
			{Iface: "rt0", Prefix: raPrefix, RouterLifetime: 3 * time.Hour},
			{Iface: "rt0", Prefix: raPrefix, MTU: 1000},
			{Iface: "rt0", Prefix: raPrefix, RDNSS: []netip.Addr{netip.MustParseAddr("10.0.0.1")}},
		} {
			var err error
			l.router.Do(func() error { _, err = Start(c, nil); return nil })
			if err == nil || !strings.Contains(err.Error(), "rt0") {
				t.Errorf("Start(%+v): %v, want an error naming rt0", c, err)
			}
		}
	})
}

// routerMAC is rt0's MAC.
func (l *raLab) routerMAC(t *testing.T) net.HardwareAddr {
	t.Helper()
	var mac net.HardwareAddr
	mustDo(t, l.router, func() error {
		ifi, err := net.InterfaceByName("rt0")
		if err == nil {
			mac = ifi.HardwareAddr
		}
		return err
	})
	return mac
}

// checkRA checks that ra says what cfg says, from the interface with mac.
func checkRA(t *testing.T, ra *ndp.RouterAdvertisement, cfg Config, mac net.HardwareAddr) {
	t.Helper()
	if ra.RouterLifetime != cfg.RouterLifetime {
		t.Errorf("router lifetime %v, want %v", ra.RouterLifetime, cfg.RouterLifetime)
	}
	var seen []string
	for _, o := range ra.Options {
		switch o := o.(type) {
		case *ndp.LinkLayerAddress:
			seen = append(seen, "lla")
			if o.Direction != ndp.Source || !bytes.Equal(o.Addr, mac) {
				t.Errorf("link-layer address option %v %s, want source %s", o.Direction, o.Addr, mac)
			}
		case *ndp.PrefixInformation:
			seen = append(seen, "prefix")
			if got := netip.PrefixFrom(o.Prefix, int(o.PrefixLength)); got != cfg.Prefix || !o.OnLink || !o.AutonomousAddressConfiguration ||
				o.ValidLifetime != ValidLifetime || o.PreferredLifetime != raPreferredLifetime {
				t.Errorf("prefix option %+v, want %s on-link autonomous", o, cfg.Prefix)
			}
		case *ndp.MTU:
			seen = append(seen, "mtu")
			if int(o.MTU) != cfg.MTU {
				t.Errorf("MTU option %d, want %d", o.MTU, cfg.MTU)
			}
		case *ndp.RecursiveDNSServer:
			seen = append(seen, "rdnss")
			if !slices.Equal(o.Servers, cfg.RDNSS) || o.Lifetime != raDNSLifetime {
				t.Errorf("RDNSS option %v lifetime %v, want %v lifetime %v", o.Servers, o.Lifetime, cfg.RDNSS, raDNSLifetime)
			}
		case *ndp.DNSSearchList:
			seen = append(seen, "dnssl")
			if !slices.Equal(o.DomainNames, cfg.DNSSL) || o.Lifetime != raDNSLifetime {
				t.Errorf("DNSSL option %v lifetime %v, want %v lifetime %v", o.DomainNames, o.Lifetime, cfg.DNSSL, raDNSLifetime)
			}
		default:
			t.Errorf("unexpected option %T %+v", o, o)
		}
	}
	if want := []string{"lla", "prefix", "mtu", "rdnss", "dnssl"}; !slices.Equal(seen, want) {
		t.Errorf("options %v, want %v", seen, want)
	}
}

// BenchmarkSendRA sends RAs on a link of a namespace that holds 2,000
// other links, as a host with a fleet's TAPs does. An RA whose address
// named its interface by name made Go read every link to resolve it (a
// netlink dump: milliseconds a send here, and growing with the links);
// one sent by interface index reads none (docs/performance.md).
func BenchmarkSendRA(b *testing.B) {
	testutil.RequireRoot(b, "creates network namespaces")
	l := &raLab{router: testutil.NewNS(b, "ra-router"), vm: testutil.NewNS(b, "ra-vm")}
	testutil.Run(b, "ip", "-n", l.router.Name, "link", "add", "rt0", "type", "veth", "peer", "name", "eth0", "netns", l.vm.Name)
	var batch strings.Builder
	for i := range 2000 {
		fmt.Fprintf(&batch, "link add d%d type bridge\n", i)
	}
	cmd := l.router.Command(b.Context(), "ip", "-batch", "-")
	cmd.Stdin = strings.NewReader(batch.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("adding links: %v\n%s", err, out)
	}
	if err := l.router.Do(func() error { return ipv6Sysctls("rt0", "accept_dad", "0", "accept_ra", "0") }); err != nil {
		b.Fatal(err)
	}
	l.router.MustRun(b, "ip", "link", "set", "rt0", "up")
	l.vm.MustRun(b, "ip", "link", "set", "eth0", "up")
	var s *Server
	if err := l.router.Do(func() (err error) {
		s, err = Start(Config{Iface: "rt0", Prefix: raPrefix, RouterLifetime: 30 * time.Minute}, slog.New(slog.DiscardHandler))
		return err
	}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	sent := s.sent.Load()
	// From the namespace, as the controller sends: a lookup of a zone
	// reads the links of the calling thread's namespace.
	l.router.Do(func() error {
		for b.Loop() {
			s.send(s.ra)
		}
		return nil
	})
	if got := s.sent.Load() - sent; got < uint64(b.N) {
		b.Fatalf("%d of %d RAs sent", got, b.N)
	}
}
