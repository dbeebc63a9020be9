package controller_test

import (
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

	"github.com/vmnetctl/vmnetctl/controller"
	"github.com/vmnetctl/vmnetctl/test/simvm"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// multiHostNetworks is one network across three hosts, the same file on
// each (docs/multihost.md).
const multiHostNetworks = `networks:
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
`

// TestMultiHost runs vmnetctl on three hosts (namespaces on an underlay
// bridge) with the same networks.yaml, a VM on each: leases from each
// host's slice, the VMs reach each other by IP, with full-size frames and
// TCP, and by their VM-file names, status and the metrics show the
// tunnel; `down` on one host leaves the other two working, and when it
// comes back with its VM, it is reached again.
func TestMultiHost(t *testing.T) {
	t.Parallel()
	multiHost(t, "mh", false)
}

// TestMultiHostWireGuard is TestMultiHost with the underlay encrypted
// (vxlan.wireguard): each host's key from `vmnetctl wireguard pubkey`;
// on the underlay, no packet to the VXLAN port or the name service, only
// WireGuard's; status shows each peer's handshake.
func TestMultiHostWireGuard(t *testing.T) {
	t.Parallel()
	multiHost(t, "mw", true)
}

// multiHost is TestMultiHost, with or without WireGuard; prefix names its
// namespaces.
func multiHost(t *testing.T, prefix string, wireguard bool) {
	underlay := testutil.NewNS(t, prefix+"-ul")
	underlay.MustRun(t, "ip", "link", "add", "ul", "up", "type", "bridge")
	// What crosses the underlay, by UDP port: the bridge's forward hook
	// sees every packet between the hosts.
	underlay.MustRun(t, "nft", "add table bridge ul; add chain bridge ul cross { type filter hook forward priority 0; }; "+
		"add rule bridge ul cross udp dport 4789 counter comment vxlan; add rule bridge ul cross udp dport 5380 counter comment names; "+
		"add rule bridge ul cross udp dport 51820 counter comment wireguard")
	type hostVM struct {
		h   *simvm.Host
		vms string
		vm  *simvm.VM
		ip  string
	}
	var hosts []*hostVM
	up := func(i int) {
		x := hosts[i]
		x.h.MustVmnetctl("up", "-f", x.vms)
		x.vm = x.h.VM(x.h.Attachment(x.h.Status(), fmt.Sprintf("web%d", i+1)))
		x.ip = x.vm.DHCP(t)["ip"]
	}
	for i := range 3 {
		h := simvm.NewHost(t, fmt.Sprintf("%s%d", prefix, i+1), multiHostNetworks, "pgrep")
		ulIf := fmt.Sprintf("ul%d", i+1)
		testutil.Run(t, "ip", "-n", underlay.Name, "link", "add", ulIf, "master", "ul", "up", "type", "veth", "peer", "name", "underlay", "netns", h.Name)
		h.MustRun(t, "ip", "addr", "add", fmt.Sprintf("10.78.0.%d/24", i+1), "dev", "underlay")
		h.MustRun(t, "ip", "link", "set", "underlay", "up")
		hosts = append(hosts, &hostVM{h: h, vms: h.WriteFile("vms.yaml", fmt.Sprintf("vms:\n  web%d:\n    networks:\n      - vmnet: lab\n", i+1))})
	}
	if wireguard {
		// Each host's key, as a user would gather them.
		var keys []string
		for _, x := range hosts {
			keys = append(keys, strings.TrimSpace(x.h.MustVmnetctl("wireguard", "pubkey")))
		}
		nets := multiHostNetworks
		for i, k := range keys {
			nets = strings.Replace(nets, fmt.Sprintf("address: 10.78.0.%d}", i+1), fmt.Sprintf("address: 10.78.0.%d, publicKey: %q}", i+1, k), 1)
		}
		nets = strings.Replace(nets, "      hosts:", "      wireguard: {subnet: 10.255.210.0/24}\n      hosts:", 1)
		for _, x := range hosts {
			if err := os.WriteFile(x.h.Networks, []byte(nets), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := range hosts {
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
	mtu := 1450 // the underlay's 1500 less VXLAN's 50
	if wireguard {
		mtu = 1390 // and WireGuard's 60
	}
	if wireguard {
		// Two hosts whose first WireGuard handshakes cross both wait for
		// the other's data; the next attempt, up to 5 s on, settles it.
		for i, x := range hosts {
			for j, y := range hosts {
				if i != j {
					testutil.Eventually(t, 15*time.Second, func() error { return x.vm.Ping(y.ip, 1) }, fmt.Sprintf("host %d's VM to reach host %d's", i+1, j+1))
				}
			}
		}
	}
	for i, x := range hosts {
		for j, y := range hosts {
			if i == j {
				continue
			}
			if err := x.vm.Ping(y.ip, 1); err != nil {
				t.Errorf("host %d's VM cannot reach host %d's (%s): %v", i+1, j+1, y.ip, err)
			}
			// A full-size frame, not fragmented: the tunnel has room for it.
			if out, err := x.vm.Run(t.Context(), "ping", "-n", "-q", "-c", "1", "-W", "3", "-M", "do", "-s", strconv.Itoa(mtu-28), y.ip); err != nil {
				t.Errorf("host %d's VM cannot send host %d's a full-size frame (MTU %d): %v\n%s", i+1, j+1, mtu, err, out)
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
	for i, x := range hosts {
		var tun *controller.NetworkStatus
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
		if wireguard && tun != nil && tun.Tunnel != nil {
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
		}
		resp, err := x.h.HTTPClient().Get("http://" + controller.DefaultMetricsAddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if wireguard && len(regexp.MustCompile(`(?m)^vmnetctl_network_wireguard_bytes_total\{direction="rx",host="h\d",network="lab"\} [1-9]`).FindAll(b, -1)) != 2 {
			t.Errorf("host %d's metrics lack WireGuard's bytes from 2 hosts:\n%s", i+1, testutil.Lines(string(b), "wireguard"))
		}
		if !regexp.MustCompile(`(?m)^vmnetctl_network_tunnel_peers\{network="lab"\} 2$`).Match(b) ||
			!regexp.MustCompile(`(?m)^vmnetctl_network_tunnel_bytes_total\{direction="rx",network="lab"\} [1-9]`).Match(b) {
			t.Errorf("host %d's metrics lack the tunnel's peers or bytes:\n%s", i+1, testutil.Lines(string(b), "tunnel"))
		}
	}
	// Encrypted: nothing plain between the hosts, only WireGuard.
	counted := underlay.MustRun(t, "nft", "list", "chain", "bridge", "ul", "cross")
	packets := func(what string) int {
		m := regexp.MustCompile(`counter packets (\d+) .*comment "` + what + `"`).FindStringSubmatch(counted)
		if m == nil {
			t.Fatalf("no counter %s in\n%s", what, counted)
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	if vx, names, wg := packets("vxlan"), packets("names"), packets("wireguard"); wireguard && (vx != 0 || names != 0 || wg == 0) ||
		!wireguard && (vx == 0 || names == 0 || wg != 0) {
		t.Errorf("on the underlay: %d VXLAN packets, %d name queries, %d WireGuard packets; want only %s", vx, names, wg, map[bool]string{true: "WireGuard's", false: "VXLAN's and names'"}[wireguard])
	}
	if wireguard {
		// Drift: host 1's WireGuard device deleted behind vmnetctl's back
		// is made again, and its VM reaches the others again.
		hosts[0].h.MustRun(t, "ip", "link", "del", "vmw-lab")
		testutil.Eventually(t, 15*time.Second, func() error { return hosts[0].vm.Ping(hosts[1].ip, 1) }, "host 1's WireGuard device to be repaired")
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
