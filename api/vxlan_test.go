package api

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const vxlanNet = `networks:
  lab:
    mode: shared
    gateway: 192.168.120.1
    dhcpEnd: 192.168.120.100
    netmask: 255.255.255.0
    vxlan:
      vni: 120
      hosts:
        - {name: rack1, address: 10.0.0.1}
        - {name: rack2, address: 10.0.0.2}
        - {name: rack3, address: 10.0.0.3}
`

func TestVXLAN(t *testing.T) {
	nets := mustNetworks(t, vxlanNet)
	n := nets.Get("lab")
	want := &VXLAN{VNI: 120, Port: DefaultVXLANPort, UnderlayMTU: 1500, DNSPort: DefaultVXLANDNSPort, Hosts: []VXLANHost{
		{"rack1", netip.MustParseAddr("10.0.0.1"), ""}, {"rack2", netip.MustParseAddr("10.0.0.2"), ""}, {"rack3", netip.MustParseAddr("10.0.0.3"), ""}}}
	if diff := cmp.Diff(want, n.VXLAN, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("vxlan (-want +got):\n%s", diff)
	}
	// The frames must fit the tunnel: 1500 - 50.
	if n.MTU != 1450 {
		t.Errorf("MTU %d, want 1450 (the underlay's 1500 less VXLAN's 50)", n.MTU)
	}
	// .2-.100 is 99 addresses: 33 per host, disjoint and covering the range.
	slices := [][2]string{{"192.168.120.2", "192.168.120.34"}, {"192.168.120.35", "192.168.120.67"}, {"192.168.120.68", "192.168.120.100"}}
	for i, s := range slices {
		start, end := n.VXLANHostSlice(i)
		if start.String() != s[0] || end.String() != s[1] {
			t.Errorf("host %d serves %s-%s, want %s-%s", i, start, end, s[0], s[1])
		}
	}
	// Two hosts over an odd range: the last takes the rest.
	nets = mustNetworks(t, "networks:\n  lab:\n    mode: host\n    gateway: 10.9.0.1\n    dhcpEnd: 10.9.0.6\n    netmask: 255.255.255.0\n    mtu: 1400\n    vxlan: {vni: 9, port: 8472, hosts: [{name: a, address: 10.0.0.1}, {name: b, address: 10.0.0.2}]}\n")
	n = nets.Get("lab")
	if s, e := n.VXLANHostSlice(1); s.String() != "10.9.0.4" || e.String() != "10.9.0.6" || n.MTU != 1400 || n.VXLAN.Port != 8472 {
		t.Errorf("host 1: %s-%s, MTU %d, port %d; want 10.9.0.4-10.9.0.6, 1400, 8472", s, e, n.MTU, n.VXLAN.Port)
	}
	if i := n.VXLANHostIndex([]netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("10.0.0.2")}); i != 1 {
		t.Errorf("host index %d, want 1", i)
	}
	if i := n.VXLANHostIndex([]netip.Addr{netip.MustParseAddr("10.0.0.3")}); i != -1 {
		t.Errorf("host index %d of a host not in the list, want -1", i)
	}
}

func TestVXLANErrors(t *testing.T) {
	const head = "networks:\n  lab:\n    mode: shared\n    gateway: 10.9.0.1\n    netmask: 255.255.255.0\n"
	hosts := "      hosts: [{name: a, address: 10.0.0.1}, {name: b, address: 10.0.0.2}]\n"
	tests := []struct {
		name  string
		src   string
		wants []want
	}{
		{"no vni", head + "    vxlan:\n" + hosts, []want{{6, "networks.lab.vxlan.vni", "is required"}}},
		{"vni too large", head + "    vxlan:\n      vni: 16777216\n" + hosts, []want{{7, "networks.lab.vxlan.vni", "outside 1-16777215"}}},
		{"no hosts", head + "    vxlan:\n      vni: 5\n", []want{{6, "networks.lab.vxlan.hosts", "is required"}}},
		{"host twice", head + "    vxlan:\n      vni: 5\n      hosts: [{name: a, address: 10.0.0.1}, {name: a, address: 10.0.0.2}]\n",
			[]want{{8, "networks.lab.vxlan.hosts[1].name", "listed twice"}}},
		{"address twice", head + "    vxlan:\n      vni: 5\n      hosts: [{name: a, address: 10.0.0.1}, {name: b, address: 10.0.0.1}]\n",
			[]want{{8, "networks.lab.vxlan.hosts[1].address", "listed twice"}}},
		{"not IPv4", head + "    vxlan:\n      vni: 5\n      hosts: [{name: a, address: fd00::1}]\n",
			[]want{{8, "networks.lab.vxlan.hosts[0].address", "not an IPv4 address"}}},
		{"unknown key", head + "    vxlan:\n      vni: 5\n      group: 239.1.1.1\n" + hosts, []want{{8, "networks.lab.vxlan.group", "unknown field"}}},
		{"mtu does not fit", head + "    mtu: 1500\n    vxlan:\n      vni: 5\n" + hosts,
			[]want{{7, "networks.lab.vxlan", "set mtu to at most 1450, or underlayMTU to at least 1550"}}},
		{"IPv6 below its MTU", head + "    subnet6: fd00:9::/64\n    vxlan:\n      vni: 5\n      underlayMTU: 1300\n" + hosts,
			[]want{{7, "networks.lab.vxlan", "below IPv6's 1280, and subnet6 is set"}}},
		{"bridged", "networks:\n  lan:\n    mode: bridged\n    interface: eth0\n    vxlan: {vni: 5}\n",
			[]want{{5, "networks.lan.vxlan", "a bridged network has no vxlan"}}},
		{"range too small", "networks:\n  lab:\n    mode: host\n    gateway: 10.9.0.1\n    dhcpEnd: 10.9.0.2\n    netmask: 255.255.255.0\n    vxlan:\n      vni: 5\n" + hosts,
			[]want{{7, "networks.lab.vxlan.hosts", "2 hosts cannot share a DHCP range of 1 addresses"}}},
		{"vni twice", head + "    vxlan: {vni: 5, hosts: [{name: a, address: 10.0.0.1}]}\n" +
			"  lab2:\n    mode: host\n    gateway: 10.8.0.1\n    netmask: 255.255.255.0\n    vxlan: {vni: 5, hosts: [{name: a, address: 10.0.0.1}]}\n",
			[]want{{7, "networks.lab2.vxlan.vni", `VNI 5 is also network "lab"'s`}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nets, diags := LoadNetworks("networks.yaml", []byte(tt.src))
			if nets != nil {
				t.Errorf("got networks, want nil on error")
			}
			checkDiags(t, diags, SeverityError, tt.wants)
		})
	}
}

// A VM file's fixed address on a network across hosts must lie outside the
// DHCP range: the other hosts do not read the file and could lease it.
func TestVXLANFixedIP(t *testing.T) {
	nets := mustNetworks(t, vxlanNet)
	for _, tt := range []struct {
		ip      string
		wantErr string
	}{{"192.168.120.50", "is in the DHCP range 192.168.120.2-192.168.120.100"}, {"192.168.120.200", ""}} {
		vf, diags := LoadVMFile("v.yaml", []byte("vms:\n  a:\n    networks:\n      - vmnet: lab\n        ip: "+tt.ip+"\n"), VMFileOptions{})
		diags = append(diags, Resolve(nets, []*VMFile{vf})...)
		if tt.wantErr == "" {
			if diags.HasErrors() {
				t.Errorf("ip %s: %v", tt.ip, diags.Errors())
			}
			continue
		}
		checkDiags(t, diags, SeverityError, []want{{5, "vms.a.networks[0].ip", tt.wantErr}})
	}
}
