package controller_test

import (
	"fmt"
	"io"
	"net/netip"
	"regexp"
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
// host's slice, the VMs reach each other by IP and by their VM-file names,
// status and the metrics show the tunnel; `down` on one host leaves the
// other two working, and when it comes back with its VM, it is reached
// again.
func TestMultiHost(t *testing.T) {
	t.Parallel()
	underlay := testutil.NewNS(t, "mh-ul")
	underlay.MustRun(t, "ip", "link", "add", "ul", "up", "type", "bridge")
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
		h := simvm.NewHost(t, fmt.Sprintf("mh%d", i+1), multiHostNetworks, "pgrep")
		ulIf := fmt.Sprintf("ul%d", i+1)
		testutil.Run(t, "ip", "-n", underlay.Name, "link", "add", ulIf, "master", "ul", "up", "type", "veth", "peer", "name", "underlay", "netns", h.Name)
		h.MustRun(t, "ip", "addr", "add", fmt.Sprintf("10.78.0.%d/24", i+1), "dev", "underlay")
		h.MustRun(t, "ip", "link", "set", "underlay", "up")
		hosts = append(hosts, &hostVM{h: h, vms: h.WriteFile("vms.yaml", fmt.Sprintf("vms:\n  web%d:\n    networks:\n      - vmnet: lab\n", i+1))})
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
	for i, x := range hosts {
		for j, y := range hosts {
			if i == j {
				continue
			}
			if err := x.vm.Ping(y.ip, 1); err != nil {
				t.Errorf("host %d's VM cannot reach host %d's (%s): %v", i+1, j+1, y.ip, err)
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
		resp, err := x.h.HTTPClient().Get("http://" + controller.DefaultMetricsAddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !regexp.MustCompile(`(?m)^vmnetctl_network_tunnel_peers\{network="lab"\} 2$`).Match(b) ||
			!regexp.MustCompile(`(?m)^vmnetctl_network_tunnel_bytes_total\{direction="rx",network="lab"\} [1-9]`).Match(b) {
			t.Errorf("host %d's metrics lack the tunnel's peers or bytes:\n%s", i+1, testutil.Lines(string(b), "tunnel"))
		}
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
