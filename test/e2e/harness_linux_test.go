package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/vmnetctl/vmnetctl/test/e2e/guest"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// lab is a throwaway network namespace with a bridge (10.99.0.1/24), one TAP
// port per guest and busybox udhcpd serving the bridge.
type lab struct {
	ns  *testutil.NS
	dir string
}

const (
	labGateway = "10.99.0.1"
	echoPort   = 7000
	labName    = "vm.e2e.test"
	labNameIP  = "10.99.0.53"
)

func newLab(t *testing.T, taps int, staticLeases map[string]string) *lab {
	t.Helper()
	testutil.RequireCommands(t, "busybox")
	l := &lab{ns: testutil.NewNS(t, "lab"), dir: t.TempDir()}
	l.ns.MustRun(t, "ip", "link", "add", "br0", "type", "bridge", "stp_state", "0", "forward_delay", "0")
	l.ns.MustRun(t, "ip", "addr", "add", labGateway+"/24", "dev", "br0")
	l.ns.MustRun(t, "ip", "link", "set", "br0", "up")
	for i := 0; i < taps; i++ {
		tap := fmt.Sprintf("tap%d", i)
		l.ns.MustRun(t, "ip", "tuntap", "add", "dev", tap, "mode", "tap")
		l.ns.MustRun(t, "ip", "link", "set", tap, "master", "br0", "up")
	}

	conf := fmt.Sprintf(`start 10.99.0.10
end 10.99.0.20
interface br0
max_leases 11
lease_file %[1]s/udhcpd.leases
pidfile %[1]s/udhcpd.pid
opt subnet 255.255.255.0
opt router %[2]s
opt dns %[2]s
opt mtu 1400
opt lease 600
`, l.dir, labGateway)
	for mac, ip := range staticLeases {
		conf += fmt.Sprintf("static_lease %s %s\n", mac, ip)
	}
	confPath := filepath.Join(l.dir, "udhcpd.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(l.dir, "udhcpd.leases"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	l.ns.Start(t, filepath.Join(l.dir, "udhcpd.log"), "busybox", "udhcpd", "-f", confPath)
	testutil.Eventually(t, 10*time.Second, func() bool { return l.ns.ListeningUDP(67) }, "udhcpd to listen on udp/67")

	// A host-side TCP echo server on the bridge address.
	l.ns.Start(t, filepath.Join(l.dir, "echo.log"), "busybox", "nc", "-ll", "-p", fmt.Sprint(echoPort), "-e", "/bin/cat")
	testutil.Eventually(t, 10*time.Second, func() bool { return l.ns.ListeningTCP(echoPort) }, "the echo server to listen on tcp/%d", echoPort)

	// A DNS server on the bridge address that knows one name.
	pc := l.ns.ListenPacket(t, "udp4", labGateway+":53")
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		if len(q.Question) == 1 && q.Question[0].Name == labName+"." && q.Question[0].Qtype == dns.TypeA {
			rr, _ := dns.NewRR(labName + ". 60 IN A " + labNameIP)
			m.Answer = append(m.Answer, rr)
		} else if len(q.Question) == 1 && q.Question[0].Name != labName+"." {
			m.Rcode = dns.RcodeNameError
		}
		w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	return l
}

func (l *lab) guestConfig(name string, tap int, mac string, s *guest.Script) guest.Config {
	return guest.Config{
		Name:    name,
		Script:  s,
		Netns:   l.ns.Name,
		NetArgs: guest.NetTap("n0", fmt.Sprintf("tap%d", tap), mac),
	}
}

func inLeaseRange(t *testing.T, r *guest.Result, key string) {
	t.Helper()
	v, _ := r.Get(key)
	if err := testutil.InRange(v, "10.99.0.10", "10.99.0.20"); err != nil {
		t.Errorf("%s: %s: %v (udhcpd's pool)", r.Name, key, err)
	}
}

func expectLease(t *testing.T, r *guest.Result) {
	t.Helper()
	r.Expect(t, "eth0.dhcp", "ok")
	inLeaseRange(t, r, "eth0.ip")
	r.Expect(t, "eth0.prefix", "24")
	r.Expect(t, "eth0.router", labGateway)
	r.Expect(t, "eth0.dns", labGateway)
	r.Expect(t, "eth0.mtu_option", "1400")
	r.Expect(t, "eth0.mtu", "1400")
}

// TestHarnessGuestDHCP boots one guest on a TAP port of a bridge in a
// throwaway namespace: it must get a lease from udhcpd with the router, DNS
// and MTU options applied, ping the gateway and talk TCP to the host.
func TestHarnessGuestDHCP(t *testing.T) {
	t.Parallel()
	start := time.Now()
	img := guest.SharedImage(t)
	t.Logf("image: kernel %s (booted as %s, PVH: %v), initrd %s (cached %v, %v)", img.Kernel, img.BootKernel, img.PVHError, img.Initrd, img.Cached, img.BuildTime.Round(time.Millisecond))
	l := newLab(t, 1, nil)

	s := guest.NewScript().
		DHCP("eth0").
		Ping(labGateway).
		TCP(labGateway, echoPort).
		Echo(labGateway, echoPort, "hello-host", 10*time.Second).
		Resolve(labName, labGateway).
		Resolve("missing.e2e.test", labGateway).
		Report("route", "ip route | grep ^default")
	r := guest.Run(t, l.guestConfig("dhcp", 0, guest.MAC(1), s))

	expectLease(t, r)
	r.Expect(t, "eth0.mac", guest.MAC(1))
	r.Expect(t, guest.PingKey(labGateway), "ok")
	r.Expect(t, guest.TCPKey(labGateway, echoPort), "ok")
	r.Expect(t, guest.EchoKey(labGateway, echoPort), "ok")
	r.Expect(t, guest.ResolveKey(labName), labNameIP)
	r.Expect(t, guest.ResolveKey("missing.e2e.test"), "fail")
	r.Expect(t, "route", "default via 10.99.0.1 dev eth0")
	t.Logf("guest boot (qemu start to /init) %v, guest run %v, test %v",
		r.BootTime.Round(time.Millisecond), r.Elapsed.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}

// TestHarnessParallelGuests boots two guests at once on the same bridge:
// both get leases; B pings A and uses A's TCP echo server.
func TestHarnessParallelGuests(t *testing.T) {
	t.Parallel()
	start := time.Now()
	guest.SharedImage(t)
	const serverIP = "10.99.0.11"
	macA, macB := guest.MAC(0x0b), guest.MAC(0x0c)
	l := newLab(t, 2, map[string]string{macA: serverIP})

	a := guest.Boot(t, l.guestConfig("server", 0, macA, guest.NewScript().
		DHCP("eth0").
		Listen(7001).
		Ping(labGateway).
		AwaitConns(7001, 2, 150*time.Second)))
	b := guest.Boot(t, l.guestConfig("client", 1, macB, guest.NewScript().
		DHCP("eth0").
		Ping(labGateway).
		Echo(serverIP, 7001, "hello-vm", 150*time.Second).
		Ping(serverIP).
		// The server waits for this one, so it is still up for the ping.
		EchoAs("again", serverIP, 7001, "hello-again", 30*time.Second)))
	ra := a.MustWait(t)
	rb := b.MustWait(t)

	expectLease(t, ra)
	expectLease(t, rb)
	ra.Expect(t, "eth0.ip", serverIP)
	ra.Expect(t, guest.ListenKey(7001), "up")
	ra.Expect(t, guest.ListenKey(7001)+".conns", "2")
	ra.Expect(t, guest.ListenKey(7001)+".data", "hello-vm hello-again")
	ra.Expect(t, guest.PingKey(labGateway), "ok")
	rb.Expect(t, guest.PingKey(labGateway), "ok")
	rb.Expect(t, guest.EchoKey(serverIP, 7001), "ok")
	rb.Expect(t, guest.PingKey(serverIP), "ok")
	rb.Expect(t, "again", "ok")
	if ipA, ipB := ra.Values["eth0.ip"], rb.Values["eth0.ip"]; ipA == ipB {
		t.Errorf("both guests got %s", ipA)
	}
	t.Logf("server: boot %v, run %v; client: boot %v, run %v; test %v",
		ra.BootTime.Round(time.Millisecond), ra.Elapsed.Round(time.Millisecond),
		rb.BootTime.Round(time.Millisecond), rb.Elapsed.Round(time.Millisecond),
		time.Since(start).Round(time.Millisecond))
}
