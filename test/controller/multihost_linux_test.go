package controller_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/test/simvm"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// multiHostNetworks is one network across three hosts, the same file on
// each (docs/multihost.md); extra is added to its vxlan section.
func multiHostNetworks(extra string) string {
	return `networks:
  lab:
    mode: shared
    gateway: 10.210.0.1
    dhcpEnd: 10.210.0.90
    netmask: 255.255.255.0
    vxlan:
      vni: 210
      hosts:
        - {name: h1, address: 10.78.0.1}
        - {name: h2, address: 10.78.0.2}
        - {name: h3, address: 10.78.0.3}
` + extra
}

// TestMultiHost runs vmnetctl on three hosts with the same networks.yaml
// and a static list of peers (multiHostLab's checks).
func TestMultiHost(t *testing.T) {
	t.Parallel()
	multiHostLab(t, "mh", multiHostNetworks(""), nil, nil)
}

// TestMultiHostWireGuard is TestMultiHost with the underlay encrypted
// (vxlan.wireguard): each host's key from `vmnetctl wireguard pubkey`;
// on the underlay, no packet to the VXLAN port or the name service, only
// WireGuard's; status and the metrics show each peer's handshake and
// bytes; host 1's WireGuard device, deleted behind vmnetctl's back, is
// made again.
func TestMultiHostWireGuard(t *testing.T) {
	t.Parallel()
	multiHostLabWith(t, "mw", labOptions{
		mtu:       1390, // the underlay's 1500 less VXLAN's 50 and WireGuard's 60
		encrypted: true,
		networks: func(hosts []*hostVM) string {
			// Each host's key, as a user would gather them.
			nets := multiHostNetworks("")
			for i, x := range hosts {
				k := strings.TrimSpace(x.h.MustVmnetctl("wireguard", "pubkey"))
				nets = strings.Replace(nets, fmt.Sprintf("address: 10.78.0.%d}", i+1), fmt.Sprintf("address: 10.78.0.%d, publicKey: %q}", i+1, k), 1)
			}
			return strings.Replace(nets, "      hosts:", "      wireguard: {subnet: 10.255.210.0/24}\n      hosts:", 1)
		},
		check: func(i int, hosts []*hostVM, metrics string) {
			x := hosts[i]
			var tun *ctlapi.NetworkStatus
			for _, n := range x.h.Status().Networks {
				if n.Name == "lab" {
					tun = &n
				}
			}
			if tun == nil || tun.Tunnel == nil {
				t.Errorf("host %d: no tunnel in lab's status", i+1)
				return
			}
			shaken := 0
			for _, p := range tun.Tunnel.WireGuard {
				if time.Since(p.LastHandshake) < 3*time.Minute && p.RxBytes > 0 && p.TxBytes > 0 {
					shaken++
				}
			}
			if shaken != 2 {
				t.Errorf("host %d: WireGuard peers %+v, want 2 with a recent handshake and traffic", i+1, tun.Tunnel.WireGuard)
			}
			if out := x.h.MustVmnetctl("status"); len(regexp.MustCompile(`encrypted to h\d: handshake \d+s ago`).FindAllString(out, -1)) != 2 {
				t.Errorf("host %d's status does not show its 2 WireGuard peers:\n%s", i+1, out)
			}
			if len(regexp.MustCompile(`(?m)^vmnetctl_network_wireguard_bytes_total\{direction="rx",host="h\d",network="lab"\} [1-9]`).FindAllString(metrics, -1)) != 2 {
				t.Errorf("host %d's metrics lack WireGuard's bytes from 2 hosts:\n%s", i+1, testutil.Lines(metrics, "wireguard"))
			}
		},
		afterChecks: func(hosts []*hostVM) {
			// Drift: host 1's WireGuard device deleted behind vmnetctl's
			// back is made again, and its VM reaches the others again.
			hosts[0].h.MustRun(t, "ip", "link", "del", "vmw-lab")
			testutil.Eventually(t, 15*time.Second, func() error { return hosts[0].vm.Ping(hosts[1].ip, 1) }, "host 1's WireGuard device to be repaired")
		},
	})
}

// multiHostWAN is the address of the WAN namespace on the underlay, which
// each host's VM reaches through its own host's NAT.
const multiHostWAN = "10.78.0.100"

// hostVM is one host of multiHostLab and its VM.
type hostVM struct {
	h   *simvm.Host
	vms string
	vm  *simvm.VM
	ip  string
}

// multiHostLab is multiHostLabWith the networks.yaml networks, and
// prepare and check.
func multiHostLab(t *testing.T, prefix, networks string, prepare func(i int, h *simvm.Host), check func(i int, hosts []*hostVM, metrics string)) []*hostVM {
	return multiHostLabWith(t, prefix, labOptions{networks: func([]*hostVM) string { return networks }, prepare: prepare, check: check})
}

// labOptions are what a multiHostLab run adds to its checks.
type labOptions struct {
	// networks is the networks.yaml of every host, once they exist and
	// prepare ran on them.
	networks func(hosts []*hostVM) string
	// prepare, if set, runs on each host before its first `up`.
	prepare func(i int, h *simvm.Host)
	// check, if set, checks each host more once the VMs have talked.
	check func(i int, hosts []*hostVM, metrics string)
	// afterChecks, if set, runs before host 3 goes down.
	afterChecks func(hosts []*hostVM)
	// mtu is the network's (default 1450: the underlay's 1500 less VXLAN's).
	mtu int
	// encrypted: only WireGuard may cross the underlay (else VXLAN and
	// the hosts' name queries, and no WireGuard).
	encrypted bool
}

// multiHostLabWith runs vmnetctl on three hosts (namespaces on an underlay
// bridge, 10.78.0.N, with a WAN namespace beside them) with the same
// networks.yaml, a VM on each, and checks: leases from each host's slice;
// the VMs reach each other by IP (full-size frames, TCP) and by their
// VM-file names; each reaches the WAN through its own host; status and the
// metrics show the tunnel; what crosses the underlay; `down` on one host
// leaves the other two working, and when it comes back with its VM, it is
// reached again. It returns the hosts, all up.
func multiHostLabWith(t *testing.T, prefix string, o labOptions) []*hostVM {
	if o.mtu == 0 {
		o.mtu = 1450
	}
	underlay := testutil.NewNS(t, prefix+"-ul")
	underlay.MustRun(t, "ip", "link", "add", "ul", "up", "type", "bridge")
	// What crosses the underlay, by UDP port: the bridge's forward hook
	// sees every packet between the hosts. A name server's answer goes
	// to the asker's ephemeral port, which may be 51820: WireGuard's
	// count leaves out what comes from the names' port.
	underlay.MustRun(t, "nft", "add table bridge ul; add chain bridge ul cross { type filter hook forward priority 0; }; "+
		"add rule bridge ul cross udp dport 4789 counter comment vxlan; add rule bridge ul cross udp dport 5380 counter comment names; "+
		"add rule bridge ul cross udp sport != 5380 udp dport 51820 counter comment wireguard")
	wan := testutil.NewNS(t, prefix+"-wan")
	testutil.Run(t, "ip", "-n", underlay.Name, "link", "add", "ulw", "master", "ul", "up", "type", "veth", "peer", "name", "eth0", "netns", wan.Name)
	wan.MustRun(t, "ip", "addr", "add", multiHostWAN+"/24", "dev", "eth0")
	wan.MustRun(t, "ip", "link", "set", "eth0", "up")
	var hosts []*hostVM
	up := func(i int) {
		x := hosts[i]
		x.h.MustVmnetctl("up", "-f", x.vms)
		x.vm = x.h.VM(x.h.Attachment(x.h.Status(), fmt.Sprintf("web%d", i+1)))
		x.ip = x.vm.DHCP(t)["ip"]
	}
	for i := range 3 {
		h := simvm.NewHost(t, fmt.Sprintf("%s%d", prefix, i+1), multiHostNetworks(""), "pgrep")
		ulIf := fmt.Sprintf("ul%d", i+1)
		testutil.Run(t, "ip", "-n", underlay.Name, "link", "add", ulIf, "master", "ul", "up", "type", "veth", "peer", "name", "underlay", "netns", h.Name)
		h.MustRun(t, "ip", "addr", "add", fmt.Sprintf("10.78.0.%d/24", i+1), "dev", "underlay")
		h.MustRun(t, "ip", "link", "set", "underlay", "up")
		if o.prepare != nil {
			o.prepare(i, h)
		}
		hosts = append(hosts, &hostVM{h: h, vms: h.WriteFile("vms.yaml", fmt.Sprintf("vms:\n  web%d:\n    networks:\n      - vmnet: lab\n", i+1))})
	}
	nets := o.networks(hosts)
	for i, x := range hosts {
		if err := os.WriteFile(x.h.Networks, []byte(nets), 0o644); err != nil {
			t.Fatal(err)
		}
		up(i)
	}
	// .2-.90 in three: .2-.30, .31-.59, .60-.90.
	for i, x := range hosts {
		ip := netip.MustParseAddr(x.ip)
		lo, hi := netip.AddrFrom4([4]byte{10, 210, 0, byte(2 + 29*i)}), netip.AddrFrom4([4]byte{10, 210, 0, byte(30 + 29*i)})
		if i == 2 {
			hi = netip.MustParseAddr("10.210.0.90")
		}
		if ip.Less(lo) || hi.Less(ip) {
			t.Errorf("host %d's VM leased %s, outside its slice %s-%s", i+1, ip, lo, hi)
		}
	}
	resolve := func(from *simvm.VM, name string) (string, error) {
		var got string
		err := from.Do(func() error {
			m := new(dns.Msg)
			m.SetQuestion(dns.Fqdn(name), dns.TypeA)
			resp, _, err := (&dns.Client{Timeout: 3 * time.Second}).Exchange(m, "10.210.0.1:53")
			if err != nil {
				return err
			}
			for _, rr := range resp.Answer {
				if a, ok := rr.(*dns.A); ok {
					got = a.A.String()
				}
			}
			return nil
		})
		return got, err
	}
	// fullPing sends one ping of a full-size frame (the network's MTU
	// less IPv4's and ICMP's 28 bytes of payload), not fragmented.
	fullPing := func(from *simvm.VM, to string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := from.Run(ctx, "ping", "-n", "-q", "-c", "1", "-W", "3", "-s", strconv.Itoa(o.mtu-28), "-M", "do", to)
		return err
	}
	// The tunnel's forwarding table is there at once (static peers), or
	// once the hosts' BGP sessions are up (EVPN); two hosts whose first
	// WireGuard handshakes cross wait for the next attempt, up to 5 s on.
	for i, x := range hosts {
		for j, y := range hosts {
			if i != j {
				testutil.Eventually(t, 20*time.Second, func() error { return x.vm.Ping(y.ip, 1) }, fmt.Sprintf("host %d's VM to reach host %d's", i+1, j+1))
			}
		}
	}
	for i, x := range hosts {
		for j, y := range hosts {
			if i == j {
				continue
			}
			if err := fullPing(x.vm, y.ip); err != nil {
				t.Errorf("host %d's VM cannot reach host %d's (%s) with full-size frames (MTU %d): %v", i+1, j+1, y.ip, o.mtu, err)
			}
			if err := tcpEcho(t, x.vm, y.vm, y.ip); err != nil {
				t.Errorf("TCP from host %d's VM to host %d's: %v", i+1, j+1, err)
			}
			name := fmt.Sprintf("web%d.vmnet.internal", j+1)
			if got, err := resolve(x.vm, name); err != nil || got != y.ip {
				t.Errorf("host %d's VM resolves %s to %q (%v), want %s", i+1, name, got, err, y.ip)
			}
		}
	}
	// TCP across hosts, and from each VM to the WAN, which sees its host.
	srv := hosts[1].vm.Listen(t, "tcp4", hosts[1].ip+":0")
	wanSrv := wan.Listen(t, "tcp4", multiHostWAN+":0")
	seen := make(chan string, 8)
	for _, l := range []net.Listener{srv, wanSrv} {
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				seen <- c.RemoteAddr().(*net.TCPAddr).IP.String()
				c.Close()
			}
		}()
	}
	dial := func(from *simvm.VM, addr string) error {
		return from.Do(func() error {
			c, err := net.DialTimeout("tcp4", addr, 5*time.Second)
			if err == nil {
				c.Close()
			}
			return err
		})
	}
	if err := dial(hosts[0].vm, srv.Addr().String()); err != nil {
		t.Errorf("TCP from host 1's VM to host 2's: %v", err)
	} else if src := <-seen; src != hosts[0].ip {
		t.Errorf("host 2's VM saw a connection from %s, want host 1's VM %s", src, hosts[0].ip)
	}
	for i, x := range hosts {
		if err := dial(x.vm, wanSrv.Addr().String()); err != nil {
			t.Errorf("host %d's VM cannot reach the WAN: %v", i+1, err)
		} else if src, want := <-seen, fmt.Sprintf("10.78.0.%d", i+1); src != want {
			t.Errorf("the WAN saw host %d's VM as %s, want its own host's %s", i+1, src, want)
		}
	}
	for i, x := range hosts {
		var tun *ctlapi.NetworkStatus
		for _, n := range x.h.Status().Networks {
			if n.Name == "lab" {
				tun = &n
			}
		}
		if tun == nil || tun.Tunnel == nil || tun.Tunnel.Host != fmt.Sprintf("h%d", i+1) || len(tun.Tunnel.Peers) != 2 || tun.Tunnel.RemoteMACs < 2 {
			t.Errorf("host %d: status of lab %+v, want its tunnel as h%d to 2 peers with the 2 other VMs learned", i+1, tun, i+1)
		}
		if tun != nil && tun.State != "up" {
			t.Errorf("host %d: lab is %s: %s", i+1, tun.State, tun.Error)
		}
		resp, err := x.h.HTTPClient().Get("http://" + ctlapi.DefaultMetricsAddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !regexp.MustCompile(`(?m)^vmnetctl_network_tunnel_peers\{network="lab"\} 2$`).Match(b) ||
			!regexp.MustCompile(`(?m)^vmnetctl_network_tunnel_bytes_total\{direction="rx",network="lab"\} [1-9]`).Match(b) {
			t.Errorf("host %d's metrics lack the tunnel's peers or bytes:\n%s", i+1, testutil.Lines(string(b), "tunnel"))
		}
		if o.check != nil {
			o.check(i, hosts, string(b))
		}
	}
	counted := underlay.MustRun(t, "nft", "list", "chain", "bridge", "ul", "cross")
	packets := func(what string) int {
		m := regexp.MustCompile(`counter packets (\d+) .*comment "` + what + `"`).FindStringSubmatch(counted)
		if m == nil {
			t.Fatalf("no counter %s in\n%s", what, counted)
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	if vx, names, wg := packets("vxlan"), packets("names"), packets("wireguard"); o.encrypted && (vx != 0 || names != 0 || wg == 0) ||
		!o.encrypted && (vx == 0 || names == 0 || wg != 0) {
		t.Errorf("on the underlay: %d VXLAN packets, %d name queries, %d WireGuard packets; want only %s", vx, names, wg, map[bool]string{true: "WireGuard's", false: "VXLAN's and names'"}[o.encrypted])
	}
	if o.afterChecks != nil {
		o.afterChecks(hosts)
	}
	// Host 3 goes down: 1 and 2 keep talking. It comes back: reached again.
	hosts[2].h.MustVmnetctl("down", "-f", hosts[2].vms)
	hosts[2].vm.Close()
	if err := hosts[0].vm.Ping(hosts[1].ip, 1); err != nil {
		t.Errorf("with host 3 down, host 1's VM cannot reach host 2's: %v", err)
	}
	if got, _ := resolve(hosts[0].vm, "web3"); got != "" {
		t.Errorf("with host 3 down, web3 still resolves to %s", got)
	}
	up(2)
	testutil.Eventually(t, 15*time.Second, func() error { return hosts[0].vm.Ping(hosts[2].ip, 1) }, "host 3's VM to be reached again")
	if got, err := resolve(hosts[1].vm, "web3"); err != nil || got != hosts[2].ip {
		t.Errorf("host 3 back: web3 resolves to %q (%v), want %s", got, err, hosts[2].ip)
	}
	return hosts
}

// tcpEcho connects from one VM to a listener in another, at ip, and has a
// line echoed back.
func tcpEcho(t *testing.T, from, to *simvm.VM, ip string) error {
	l := to.Listen(t, "tcp4", ip+":0")
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		io.Copy(c, c)
	}()
	return from.Do(func() error {
		c, err := net.DialTimeout("tcp4", l.Addr().String(), 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		msg := strings.Repeat("x", 8000) + "\n" // several segments
		if _, err := io.WriteString(c, msg); err != nil {
			return err
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(c, got); err != nil {
			return err
		}
		if string(got) != msg {
			return fmt.Errorf("echoed %d bytes differ", len(got))
		}
		return nil
	})
}
