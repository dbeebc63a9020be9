package e2e

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/launch"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/test/e2e/guest"
	"github.com/vmnetctl/vmnetctl/test/simvm"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// The world of TestGuests: a "host" namespace where vmnetctl runs, and a
// "WAN" namespace behind it (veth uplink, the host routes by default to the
// WAN side). The WAN routes the VM subnets back to the host, so only
// vmnetctl's NAT and filtering decide what a VM's packet looks like there
// and whether it gets there at all.
const (
	sharedGW  = "10.61.0.1"  // shared (NAT) network
	isoGW     = "10.62.0.1"  // shared with isolation: true
	jumboGW   = "10.63.0.1"  // host-only network with mtu: 9000
	aShared   = "10.61.0.10" // VM a's fixed addresses
	aIso      = "10.62.0.10"
	shared6   = "fd00:61::/64" // shared's IPv6 prefix (subnet6); the others derive theirs
	sharedGW6 = "fd00:61::1"
	wanHost   = "198.51.100.1" // the host's uplink address (TEST-NET-2)
	wanPeer   = "198.51.100.2" // the WAN namespace: TCP echo servers
	wanPort   = 8080           // WAN echo server, always up
	gatePort  = 8081           // WAN echo server opened once the host-side checks are done
	vmPort    = 7001           // VM a's echo server
	fwdPort   = 7002           // VM a's echo server behind a port forward
	fwdHost   = 17002          // its host port (portForwards in upVMs)
)

const e2eNetworks = `vmnet:
  shared:
    mode: shared
    subnet: 10.61.0.0/24
    subnet6: fd00:61::/64
  iso:
    mode: shared
    subnet: 10.62.0.0/24
    isolation: true
  jumbo:
    mode: host
    subnet: 10.63.0.0/24
    mtu: 9000
    socket: true
    reservations:
      "52:55:55:e3:00:01": 10.63.0.201
      "52:55:55:e3:00:02": 10.63.0.202
`

// VMs brought up by `vmnetctl up`: a connects its own unix datagram sockets
// to the helpers' (qemu -netdev dgram with the arguments of `vmnetctl args`);
// c opens TAP devices (attach: tap).
const upVMs = `vms:
  a:
    networks:
      - vmnet: shared
        ip: 10.61.0.10
        portForwards:
          - guestPort: 7002
            hostPort: 17002
            hostIP: 0.0.0.0
      - vmnet: iso
        ip: 10.62.0.10
      - vmnet: jumbo
  c:
    networks:
      - vmnet: shared
        attach: tap
      - vmnet: jumbo
        attach: tap
`

// The VM started by `vmnetctl run` (socketpairs on fds 4 and 5). Its MACs are
// fixed in the file because `vmnetctl args b` knows b only while it runs
// (inside the command, $VMNETCTL_MACS has them).
const (
	runVMs = `vms:
  b:
    networks:
      - vmnet: shared
        macAddress: "` + bMAC0 + `"
      - vmnet: iso
        macAddress: "` + bMAC1 + `"
      - vmnet: jumbo
        attach: tap
        macAddress: "` + bMAC2 + `"
`
	bMAC0 = "52:55:55:e2:00:b0"
	bMAC1 = "52:55:55:e2:00:b1"
	bMAC2 = "52:55:55:e2:00:b2"
)

// world is the host under test (a simvm.Host: its namespace, state dir,
// networks.yaml and VM files) and the WAN behind it.
type world struct {
	*simvm.Host
	t   *testing.T
	wan *testutil.NS // network namespace behind the host's uplink
}

func newWorld(t *testing.T) *world {
	t.Helper()
	w := &world{Host: simvm.NewHost(t, "vmne2e", e2eNetworks, "qemu-system-x86_64"), t: t}
	guest.SharedImage(t) // a kernel and busybox: skips without them, or fails with CI=true
	w.wan = testutil.NewNS(t, "wan")
	// Registered after the namespaces, so it runs before they are deleted
	// (and after the guests, booted later, are killed). Deleting the host
	// namespace kills what is left in it (the controller, helpers).
	t.Cleanup(w.teardown)

	testutil.Run(t, "ip", "-n", w.Name, "link", "add", "uplink", "type", "veth", "peer", "name", "eth0", "netns", w.wan.Name)
	w.MustRun(t, "ip", "addr", "add", wanHost+"/24", "dev", "uplink")
	w.MustRun(t, "ip", "link", "set", "uplink", "up")
	w.MustRun(t, "ip", "route", "add", "default", "via", wanPeer)
	w.wan.MustRun(t, "ip", "addr", "add", wanPeer+"/24", "dev", "eth0")
	w.wan.MustRun(t, "ip", "link", "set", "eth0", "up")
	w.wan.MustRun(t, "ip", "route", "add", "10.60.0.0/14", "via", wanHost)
	return w
}

// teardown removes everything vmnetctl made.
func (w *world) teardown() {
	if out, err := w.Vmnetctl("down", "--all"); err != nil {
		w.t.Errorf("down --all: %v\n%s", err, out)
	}
}

// qemuArgs runs `vmnetctl args VM --vmm qemu` and splits its words (the
// arguments here need no shell quoting).
func (w *world) qemuArgs(vm string) []string {
	w.t.Helper()
	out := strings.TrimSpace(w.MustVmnetctl("args", vm, "--vmm", "qemu"))
	if strings.ContainsAny(out, `'"\`) {
		w.t.Fatalf("args %s: quoted words, split them with a shell: %s", vm, out)
	}
	return strings.Fields(out)
}

// echoServer is a TCP line echo server in a namespace that records the
// source address of every connection.
type echoServer struct {
	mu    sync.Mutex
	peers []string
	data  []string
}

func (s *echoServer) sources() ([]string, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.peers...), append([]string(nil), s.data...)
}

func serveEcho(t *testing.T, ns *testutil.NS, addr string) *echoServer {
	t.Helper()
	ln := ns.Listen(t, "tcp4", addr)
	s := &echoServer{}
	go testutil.ServeConns(ln, func(c net.Conn) {
		c.SetDeadline(time.Now().Add(10 * time.Second))
		line, _ := bufio.NewReader(c).ReadString('\n')
		s.mu.Lock()
		s.peers = append(s.peers, c.RemoteAddr().(*net.TCPAddr).IP.String())
		s.data = append(s.data, strings.TrimSpace(line))
		s.mu.Unlock()
		c.Write([]byte(line))
	})
	return s
}

// dialEcho connects to addr from ns, sends payload as one line, closes its
// side and returns the line it read back.
func dialEcho(ns *testutil.NS, addr, payload string) (string, error) {
	got, err := ns.Exchange(addr, payload+"\n")
	return strings.TrimSpace(got), err
}

// staleSocket leaves a unix datagram socket file at path, as a qemu that was
// killed leaves its local.path behind.
func staleSocket(t *testing.T, path string) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatalf("bind %s: %v", path, err)
	}
}

// expectIn6 reports a test error unless key is an IPv6 address in prefix.
func expectIn6(t *testing.T, r *guest.Result, key, prefix string) {
	t.Helper()
	v, _ := r.Get(key)
	if a, err := netip.ParseAddr(v); err != nil || !a.Is6() || !netip.MustParsePrefix(prefix).Contains(a) {
		t.Errorf("%s: %s = %q, want an address in %s (console %s)\n%s", r.Name, key, v, prefix, r.LogPath, r.Before("E2E "+key+"=", 15))
	}
}

func attachmentByMAC(st *ctlapi.Status, mac string) (ctlapi.AttachmentStatus, bool) {
	for _, a := range st.Attachments {
		if strings.EqualFold(a.MAC, mac) {
			return a, true
		}
	}
	return ctlapi.AttachmentStatus{}, false
}

// TestGuests boots three real guests on vmnetctl networks, one per way of
// attaching a VMM, all at once:
//
//	a: `vmnetctl up`, then qemu with `vmnetctl args a --vmm qemu`
//	   (-netdev dgram over unix sockets, over a stale local.path);
//	   shared (fixed .10) + iso (fixed .10) + jumbo. Serves TCP for the others,
//	   and on fwdPort through a port forward (portForwards, hostIP 0.0.0.0).
//	b: `vmnetctl run -f run.yaml --vm b -- qemu ... local.type=fd,local.str=4/5`
//	   (socketpairs); shared + iso, dynamic leases.
//	c: `attach: tap`, qemu -netdev tap with the TAP names of `vmnetctl args`;
//	   jumbo (host-only, MTU 9000) + shared, dynamic leases.
//
// Checks: every guest gets the lease `status --json` reports for its MAC and
// pings its gateways; names resolve through the DNS proxy (a finds b and c,
// b finds a and c as NAME.vmnet.internal, c finds the bare name a); every
// guest reaches a TCP server in the WAN namespace through NAT (the server sees
// the host's uplink address, although the WAN routes the VM subnets back), c
// cannot reach it from the host-only network; b and c reach a on shared, b
// cannot reach a on the isolated network but reaches its gateway; a and c
// get MTU 9000 by DHCP on jumbo and ping its gateway with 8000-byte packets
// (through a socket helper and a TAP); `vmnetctl run` exits with qemu's
// status (0) and b leaves `status` when it does. IPv6: every guest gets an
// address in shared's subnet6 by SLAAC and pings the IPv6 gateway; a has
// the default route of the router advertisements (nat66); over IPv6, a
// resolves b's AAAA record and c a's, both the addresses the guests
// reported (the network learned them from neighbour discovery); status
// lists b's. Port forward: a's echo server answers through the host's port
// fwdHost from the WAN (at the host's uplink address) and from the host's
// loopback, a sees exactly those two connections, and status counts them.
func TestGuests(t *testing.T) {
	t.Parallel()
	start := time.Now()
	w := newWorld(t)
	wanSrv := serveEcho(t, w.wan, fmt.Sprintf("%s:%d", wanPeer, wanPort))
	vms := w.WriteFile("vms.yaml", upVMs)
	runFile := w.WriteFile("run.yaml", runVMs)

	w.MustVmnetctl("up", "-f", vms)
	argsA := w.qemuArgs("a")
	argsC := w.qemuArgs("c")
	// c's words name exactly the TAPs and MACs status reports for it.
	stUp, err := w.ReadStatus()
	if err != nil {
		t.Fatal(err)
	}
	var wantC []string
	for _, att := range stUp.Attachments {
		if att.VM == "c" {
			wantC = append(wantC,
				"-netdev", fmt.Sprintf("tap,id=net%d,ifname=%s,script=no,downscript=no", att.Index, att.Tap),
				"-device", fmt.Sprintf("virtio-net-pci,netdev=net%d,mac=%s", att.Index, att.MAC))
		}
	}
	if !slices.Equal(argsC, wantC) || len(wantC) != 8 {
		t.Fatalf("args c --vmm qemu:\n%q\nwant (from status):\n%q", argsC, wantC)
	}
	// qemu binds local.path (STATE/vms/a/N.vm.sock). A socket file left there
	// by an earlier qemu must not stop the next one.
	staleSocket(t, filepath.Join(w.StateDir(), "vms", "a", "0.vm.sock"))
	upTime := time.Since(start)

	long := 150 * time.Second
	a := guest.Boot(t, guest.Config{
		Name:    "a",
		Netns:   w.Name,
		NetArgs: argsA,
		Script: guest.NewScript().
			IPv6("eth0").
			DHCP("eth0").
			Ping(sharedGW).
			Echo(wanPeer, wanPort, "from-a", 30*time.Second).
			DHCP("eth2").
			Report("jumbo.ping", "ping -c 2 -W 3 -s 8000 "+jumboGW+" >/dev/null && echo ok || echo fail").
			DHCP("eth1"). // last: the default route is iso's gateway (NAT)
			Ping(isoGW).
			Listen(vmPort).
			// Forwarded connections keep their source (DNAT only): a's
			// replies from its shared address must leave through shared,
			// not its default route (iso), whose gateway would drop them.
			Report("eth0.srcroute", "ip route add 10.61.0.0/24 dev eth0 table 61 && ip route add default via "+sharedGW+" dev eth0 table 61 && ip rule add from "+aShared+" table 61 && echo ok || echo fail").
			Listen(fwdPort).
			ResolveWithin("b.vmnet.internal", sharedGW, long).
			ResolveWithin("c", sharedGW, long).
			// IPv6 (while b and c talk to the echo server): an address by
			// SLAAC, the gateway, and b's address, which the network
			// learned from b's neighbour discovery, by DNS over IPv6.
			SLAAC("eth0", shared6, 30*time.Second).
			Ping(sharedGW6).
			ResolveAAAAWithin("b.vmnet.internal", sharedGW6, 30*time.Second).
			AwaitConns(vmPort, 3, long).
			AwaitConns(fwdPort, 2, long).
			EchoAs("gate", wanPeer, gatePort, "gate-a", long),
	})
	b := guest.Boot(t, guest.Config{
		Name:    "b",
		Netns:   w.Name,
		Wrapper: w.VmnetctlArgs("run", "-f", runFile, "--vm", "b", "--"),
		// b's third attachment is the kernel path: run hands qemu the TAP
		// itself (-netdev tap,fd=6), no helper relays its frames.
		NetArgs: slices.Concat(guest.NetDgramFD("net0", launch.FirstVMFD, bMAC0), guest.NetDgramFD("net1", launch.FirstVMFD+1, bMAC1),
			guest.NetTapFD("net2", launch.FirstVMFD+2, bMAC2)),
		Script: guest.NewScript().
			IPv6("eth0").
			DHCP("eth2").
			Report("eth2.ping", "ping -c 2 -W 3 -s 8000 "+jumboGW+" >/dev/null && echo ok || echo fail").
			DHCP("eth0").
			DHCP("eth1").
			Ping(sharedGW).
			Ping(isoGW).
			// An IPv6 address for a to look up (it pings the gateway from
			// it: the network learns it from b's neighbour discovery).
			SLAAC("eth0", shared6, 30*time.Second).
			Background(guest.NewScript().Ping(sharedGW6)).
			ResolveWithin("a.vmnet.internal", sharedGW, 30*time.Second).
			// a is up and serving once this succeeds: the checks below
			// that must fail fail because of isolation, not a slow boot.
			EchoAs("a.first", aShared, vmPort, "b-first", long).
			// The checks that must fail wait for timeouts: in the background.
			Sh(`{ e2e_report iso.ping.a "$(ping -c 2 -W 2 %s >/dev/null 2>&1 && echo ok || echo fail)"; } &`, aIso).
			Sh(`{ e2e_tcp %s %d iso.tcp.a; } &`, aIso, vmPort).
			Ping(aShared).
			Echo(wanPeer, wanPort, "from-b", 30*time.Second).
			ResolveWithin("c.vmnet.internal", sharedGW, long).
			Sh("wait").
			EchoAs("a.last", aShared, vmPort, "b-last", 30*time.Second).
			EchoAs("gate", wanPeer, gatePort, "gate-b", long),
	})
	c := guest.Boot(t, guest.Config{
		Name:    "c",
		Netns:   w.Name,
		NetArgs: argsC,
		Script: guest.NewScript().
			IPv6("eth0").
			DHCP("eth1").
			DHCP("eth0"). // the default route is now the shared gateway
			Ping(jumboGW).
			Report("jumbo.ping", "ping -c 2 -W 3 -s 8000 "+jumboGW+" >/dev/null && echo ok || echo fail").
			// The host-only network must not lead out, even for a guest
			// that routes everything to its gateway.
			Sh("ip route replace default via %s dev eth1", jumboGW).
			TCPAs("wan.hostonly", wanPeer, wanPort).
			Sh("ip route replace default via %s dev eth0", sharedGW).
			Ping(sharedGW).
			ResolveWithin("a", sharedGW, 30*time.Second).
			// IPv6 through a TAP, in the background: a's address appears
			// once a has checked its own.
			Background(guest.NewScript().
				SLAAC("eth0", shared6, 30*time.Second).
				Ping(sharedGW6).
				ResolveAAAAWithin("a", sharedGW6, long)).
			Echo(wanPeer, wanPort, "from-c", 30*time.Second).
			EchoAs("a.echo", aShared, vmPort, "c", long).
			Wait().
			EchoAs("gate", wanPeer, gatePort, "gate-c", long),
	})
	guests := []*guest.Guest{a, b, c}

	// Every lease the guests got is the one status reports for their MAC
	// (b only exists while `vmnetctl run` runs: check before the gate opens).
	type nic struct {
		g      *guest.Guest
		name   string
		ifname string
	}
	nics := []nic{{a, "a", "eth0"}, {a, "a", "eth1"}, {a, "a", "eth2"}, {b, "b", "eth0"}, {b, "b", "eth1"}, {b, "b", "eth2"}, {c, "c", "eth0"}, {c, "c", "eth1"}}
	leases := map[string]string{} // "vm/ifname" → IP
	macs := map[string]string{}
	for _, n := range nics {
		ip, err := n.g.Await(n.ifname+".ip", 3*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		mac, _ := n.g.Value(n.ifname + ".mac")
		leases[n.name+"/"+n.ifname], macs[n.name+"/"+n.ifname] = ip, mac
	}
	leaseTime := time.Since(start)
	var st *ctlapi.Status
	testutil.Eventually(t, 20*time.Second, func() bool {
		s, err := w.ReadStatus()
		if err != nil {
			t.Log(err)
			return false
		}
		st = s
		for k, ip := range leases {
			if att, ok := attachmentByMAC(s, macs[k]); !ok || att.IP != ip {
				return false
			}
		}
		return true
	}, "status --json to report every guest's lease")
	for k := range leases {
		att, _ := attachmentByMAC(st, macs[k])
		vm, ifname, _ := strings.Cut(k, "/")
		wantNet := map[string]string{"a/eth0": "shared", "a/eth1": "iso", "a/eth2": "jumbo", "b/eth0": "shared", "b/eth1": "iso", "b/eth2": "jumbo", "c/eth0": "shared", "c/eth1": "jumbo"}[k]
		if att.VM != vm || att.Network != wantNet || att.State != "running" {
			t.Errorf("%s (%s, MAC %s): status says VM %s network %s state %s", k, ifname, macs[k], att.VM, att.Network, att.State)
		}
	}
	// Anti-spoofing is on for every VM port (all networks here are shared
	// or host), and dropped none of the guests' own frames.
	for k := range leases {
		att, _ := attachmentByMAC(st, macs[k])
		guards := w.MustRun(t, "nft", "list", "set", "bridge", hostnet.TableName(att.Network), "guarded")
		if !strings.Contains(guards, fmt.Sprintf("%q", att.Tap)) {
			t.Errorf("%s: port %s is not guarded:\n%s", k, att.Tap, guards)
		}
		if att.SpoofDrops != 0 {
			t.Errorf("%s: the guard dropped %d of the guest's frames, want 0", k, att.SpoofDrops)
		}
	}
	// b's IPv6 address (SLAAC) is in status once b has used it.
	b6, err := b.Await("eth0.ip6", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, func() bool {
		s, err := w.ReadStatus()
		if err != nil {
			return false
		}
		att, ok := attachmentByMAC(s, bMAC0)
		return ok && slices.Contains(att.IPv6, b6)
	}, "status --json to list b's IPv6 address %s", b6)
	// a's service on fwdPort through the forward of upVMs: from the WAN at
	// the host's uplink address, and from the host's own loopback.
	if v, err := a.Await(guest.ListenKey(fwdPort), long); err != nil || v != "up" {
		t.Fatalf("a: echo server on %d: %q %v", fwdPort, v, err)
	}
	fwdStart := time.Now()
	for _, d := range []struct {
		ns      *testutil.NS
		addr    string
		payload string
	}{
		{w.wan, fmt.Sprintf("%s:%d", wanHost, fwdHost), "fwd-wan"},
		{w.NS, fmt.Sprintf("127.0.0.1:%d", fwdHost), "fwd-lo"},
	} {
		testutil.Eventually(t, 20*time.Second, func() error {
			got, err := dialEcho(d.ns, d.addr, d.payload)
			if err == nil && got != d.payload {
				err = fmt.Errorf("got %q back, want %q", got, d.payload)
			}
			return err
		}, "%s: echo through the forward from %s", d.addr, d.ns)
	}
	wantFwd := fmt.Sprintf("0.0.0.0:%d -> %d/tcp", fwdHost, fwdPort)
	var fwdConns uint64
	testutil.Eventually(t, 20*time.Second, func() error {
		s, err := w.ReadStatus()
		if err != nil {
			return err
		}
		att, ok := attachmentByMAC(s, macs["a/eth0"])
		if !ok {
			return fmt.Errorf("no attachment with a's MAC %s", macs["a/eth0"])
		}
		for _, f := range att.Forwards {
			if f.Forward == wantFwd {
				if fwdConns = f.Connections; fwdConns >= 2 {
					return nil
				}
				return fmt.Errorf("forward %s: %d connections, want at least 2", wantFwd, fwdConns)
			}
		}
		return fmt.Errorf("forwards %+v, want %q", att.Forwards, wantFwd)
	}, "status --json to count the forward's connections")
	fwdTime := time.Since(fwdStart)
	gate := serveEcho(t, w.wan, fmt.Sprintf("%s:%d", wanPeer, gatePort))

	results := map[string]*guest.Result{}
	for _, g := range guests {
		r := g.MustWait(t)
		results[r.Name] = r
	}
	ra, rb, rc := results["a"], results["b"], results["c"]

	// a: fixed addresses by DHCP, WAN through NAT, names of b and c.
	ra.Expect(t, "eth0.ip", aShared)
	ra.Expect(t, "eth0.router", sharedGW)
	ra.Expect(t, "eth0.dns", sharedGW)
	ra.Expect(t, "eth0.mtu", "1500")
	ra.Expect(t, "eth1.ip", aIso)
	ra.Expect(t, "eth1.router", isoGW)
	ra.Expect(t, guest.PingKey(sharedGW), "ok")
	ra.Expect(t, guest.PingKey(isoGW), "ok")
	ra.Expect(t, "eth2.mtu", "9000")
	ra.Expect(t, "jumbo.ping", "ok")
	ra.Expect(t, guest.EchoKey(wanPeer, wanPort), "ok")
	ra.Expect(t, guest.ListenKey(vmPort), "up")
	ra.Expect(t, guest.ResolveKey("b.vmnet.internal"), leases["b/eth0"])
	ra.Expect(t, guest.ResolveKey("c"), leases["c/eth0"])
	ra.Expect(t, guest.ListenKey(vmPort)+".conns", "3")
	ra.Expect(t, "eth0.srcroute", "ok")
	ra.Expect(t, guest.ListenKey(fwdPort), "up")
	ra.Expect(t, guest.ListenKey(fwdPort)+".conns", "2")
	ra.Expect(t, guest.ListenKey(fwdPort)+".data", "fwd-wan fwd-lo")
	ra.Expect(t, "gate", "ok")
	// a, b and c: IPv6 by SLAAC on shared, DNS AAAA from neighbour discovery.
	for _, r := range []*guest.Result{ra, rb, rc} {
		expectIn6(t, r, "eth0.ip6", shared6)
		r.Expect(t, guest.PingKey(sharedGW6), "ok")
	}
	if v := ra.Values["eth0.route6"]; !strings.HasPrefix(v, "default via fe80:") {
		t.Errorf("a: IPv6 default route %q, want one via the gateway's link-local address (nat66)", v)
	}
	ra.Expect(t, guest.ResolveAAAAKey("b.vmnet.internal"), rb.Values["eth0.ip6"])
	rc.Expect(t, guest.ResolveAAAAKey("a"), ra.Values["eth0.ip6"])

	// b: under vmnetctl run; shared reaches a, isolation keeps it from a.
	rb.Expect(t, "eth0.mac", bMAC0)
	rb.Expect(t, "eth1.mac", bMAC1)
	rb.Expect(t, "eth2.mac", bMAC2) // the TAP qemu took as a descriptor
	rb.Expect(t, "eth2.router", jumboGW)
	rb.Expect(t, "eth2.mtu", "9000")
	rb.Expect(t, "eth2.ping", "ok")
	rb.Expect(t, "eth0.router", sharedGW)
	rb.Expect(t, "eth1.router", isoGW)
	rb.Expect(t, guest.PingKey(sharedGW), "ok")
	rb.Expect(t, guest.PingKey(isoGW), "ok")
	rb.Expect(t, guest.ResolveKey("a.vmnet.internal"), aShared)
	rb.Expect(t, guest.ResolveKey("c.vmnet.internal"), leases["c/eth0"])
	rb.Expect(t, "a.first", "ok")
	rb.Expect(t, guest.PingKey(aShared), "ok")
	rb.Expect(t, guest.EchoKey(wanPeer, wanPort), "ok")
	rb.Expect(t, "iso.ping.a", "fail")
	rb.Expect(t, "iso.tcp.a", "fail")
	rb.Expect(t, "a.last", "ok")
	rb.Expect(t, "gate", "ok")
	if rb.ExitCode != 0 {
		t.Errorf("vmnetctl run exited with %d after qemu powered off, want 0", rb.ExitCode)
	}

	// c: TAPs; jumbo MTU from DHCP, no way out from host-only.
	rc.Expect(t, "eth1.mtu_option", "9000")
	rc.Expect(t, "eth1.mtu", "9000")
	rc.Expect(t, "eth1.router", jumboGW)
	rc.Expect(t, guest.PingKey(jumboGW), "ok")
	rc.Expect(t, "jumbo.ping", "ok")
	rc.Expect(t, "wan.hostonly", "fail")
	rc.Expect(t, "eth0.mtu", "1500")
	rc.Expect(t, guest.PingKey(sharedGW), "ok")
	rc.Expect(t, guest.ResolveKey("a"), aShared)
	rc.Expect(t, guest.EchoKey(wanPeer, wanPort), "ok")
	rc.Expect(t, "a.echo", "ok")
	rc.Expect(t, "gate", "ok")

	// The WAN saw every guest, always from the host's uplink address (NAT).
	for _, s := range []*echoServer{wanSrv, gate} {
		peers, data := s.sources()
		for i, p := range peers {
			if p != wanHost {
				t.Errorf("WAN server: %q came from %s, want %s (masqueraded)", data[i], p, wanHost)
			}
		}
	}
	_, data := wanSrv.sources()
	for _, want := range []string{"from-a", "from-b", "from-c"} {
		if !slices.Contains(data, want) {
			t.Errorf("WAN server got %q, want %s among them", data, want)
		}
	}

	// After qemu exits, `vmnetctl run` has removed b.
	if st, err := w.ReadStatus(); err != nil {
		t.Error(err)
	} else {
		for _, att := range st.Attachments {
			if att.VM == "b" {
				t.Errorf("b still in status after vmnetctl run exited: %+v", att)
			}
		}
	}

	for _, r := range []*guest.Result{ra, rb, rc} {
		t.Logf("guest %s: boot (qemu start to /init) %v, run %v", r.Name, r.BootTime.Round(time.Millisecond), r.Elapsed.Round(time.Millisecond))
	}
	t.Logf("up and args %v, all eight leases at %v, forward checks %v (%d connections), test %v", upTime.Round(time.Millisecond), leaseTime.Round(time.Millisecond), fwdTime.Round(time.Millisecond), fwdConns, time.Since(start).Round(time.Millisecond))
}
