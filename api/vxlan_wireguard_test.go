package api

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
)

// testKey is a well-formed WireGuard key, distinct for each b.
func testKey(b byte) string {
	return base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{b}, WireGuardKeyLen))
}

func wgNet(wireguard string, keys ...string) string {
	s := "networks:\n  lab:\n    mode: shared\n    gateway: 192.168.120.1\n    netmask: 255.255.255.0\n    vxlan:\n      vni: 120\n"
	if wireguard != "" {
		s += "      wireguard: " + wireguard + "\n"
	}
	s += "      hosts:\n"
	for i, k := range keys {
		s += fmt.Sprintf("        - {name: h%d, address: 10.0.0.%d", i+1, i+1)
		if k != "" {
			s += ", publicKey: \"" + k + "\""
		}
		s += "}\n"
	}
	return s
}

func TestWireGuard(t *testing.T) {
	n := mustNetworks(t, wgNet("{subnet: 10.255.0.0/24}", testKey(1), testKey(2), testKey(3))).Get("lab")
	x := n.VXLAN
	if x.WireGuard == nil || x.WireGuard.Port != DefaultWireGuardPort || x.WireGuard.Subnet.String() != "10.255.0.0/24" {
		t.Fatalf("wireguard %+v, want port %d subnet 10.255.0.0/24", x.WireGuard, DefaultWireGuardPort)
	}
	for i, want := range []string{"10.255.0.1", "10.255.0.2", "10.255.0.3"} {
		if got := x.TunnelAddr(i).String(); got != want {
			t.Errorf("host %d's tunnel address %s, want %s", i, got, want)
		}
	}
	if x.Hosts[1].PublicKey != testKey(2) {
		t.Errorf("host 1's key %q, want %q", x.Hosts[1].PublicKey, testKey(2))
	}
	// 1500 - 50 (VXLAN) - 60 (WireGuard over IPv4).
	if n.MTU != 1390 || x.FrameMTU() != 1390 || x.WireGuardMTU() != 1440 {
		t.Errorf("MTU %d, frame MTU %d, WireGuard MTU %d; want 1390, 1390, 1440", n.MTU, x.FrameMTU(), x.WireGuardMTU())
	}
	if !strings.Contains(x.String(), "wireguard port 51820 subnet 10.255.0.0/24 keys h1="+testKey(1)) {
		t.Errorf("plan's view %q lacks the WireGuard settings", x.String())
	}
	// Without WireGuard the tunnel runs between the underlay addresses.
	plain := mustNetworks(t, wgNet("", "", "")).Get("lab").VXLAN
	if plain.TunnelAddr(1).String() != "10.0.0.2" || plain.FrameMTU() != 1450 {
		t.Errorf("plain tunnel: address %s, frame MTU %d; want 10.0.0.2, 1450", plain.TunnelAddr(1), plain.FrameMTU())
	}
	if got := WireGuardName("lab"); got != "vmw-lab" || !OwnInterface(got) {
		t.Errorf("WireGuardName(lab) = %q (own interface %v), want vmw-lab", got, OwnInterface(got))
	}
	if _, err := ParseWireGuardKey(testKey(9)); err != nil {
		t.Error(err)
	}
}

func TestWireGuardErrors(t *testing.T) {
	k1, k2 := testKey(1), testKey(2)
	const wgLine, host0, host1 = 8, 10, 11
	tests := []struct {
		name  string
		src   string
		wants []want
	}{
		{"no subnet", wgNet("{port: 51820}", k1, k2), []want{{wgLine, "networks.lab.vxlan.wireguard.subnet", "is required"}}},
		{"not a prefix", wgNet("{subnet: 10.255.0.1}", k1, k2), []want{{wgLine, "networks.lab.vxlan.wireguard.subnet", "not an IPv4 prefix"}}},
		{"host bits", wgNet("{subnet: 10.255.0.1/24}", k1, k2), []want{{wgLine, "networks.lab.vxlan.wireguard.subnet", "host bits set; the prefix is 10.255.0.0/24"}}},
		{"too small", wgNet("{subnet: 10.255.0.0/30}", k1, k2, testKey(3)), []want{{wgLine, "networks.lab.vxlan.wireguard.subnet", "room for 2 hosts, and the segment has 3"}}},
		{"overlaps the network", wgNet("{subnet: 192.168.120.0/25}", k1, k2), []want{{wgLine, "networks.lab.vxlan.wireguard.subnet", "overlaps the network's own subnet"}}},
		{"port is VXLAN's", wgNet("{port: 4789, subnet: 10.255.0.0/24}", k1, k2), []want{{wgLine, "networks.lab.vxlan.wireguard.port", "also the tunnel's VXLAN port"}}},
		{"port is dnsPort", wgNet("{port: 5380, subnet: 10.255.0.0/24}", k1, k2), []want{{wgLine, "networks.lab.vxlan.wireguard.port", "also the hosts' dnsPort"}}},
		{"unknown key", wgNet("{subnet: 10.255.0.0/24, mtu: 1400}", k1, k2), []want{{wgLine, "networks.lab.vxlan.wireguard.mtu", "unknown field"}}},
		{"key missing", wgNet("{subnet: 10.255.0.0/24}", k1, ""), []want{{host1, "networks.lab.vxlan.hosts[1].publicKey", "is required with wireguard: host h2's public key"}}},
		{"bad key", wgNet("{subnet: 10.255.0.0/24}", k1, "c2hvcnQ="), []want{{host1, "networks.lab.vxlan.hosts[1].publicKey", "is not a WireGuard key"}}},
		{"key twice", wgNet("{subnet: 10.255.0.0/24}", k1, k1), []want{{host1, "networks.lab.vxlan.hosts[1].publicKey", "is also host h1's key"}}},
		{"key without wireguard", wgNet("", k1, ""), []want{{host0 - 1, "networks.lab.vxlan.hosts[0].publicKey", "has no wireguard section"}}},
		{"mtu does not fit", strings.Replace(wgNet("{subnet: 10.255.0.0/24}", k1, k2), "    vxlan:", "    mtu: 1450\n    vxlan:", 1),
			[]want{{7, "networks.lab.vxlan", "VXLAN and WireGuard add 110 bytes (50 and 60) and the underlay's MTU is 1500; set mtu to at most 1390, or underlayMTU to at least 1560"}}},
		{"underlay too small", strings.Replace(wgNet("{subnet: 10.255.0.0/24}", k1, k2), "      vni: 120\n", "      vni: 120\n      underlayMTU: 170\n", 1),
			[]want{{6, "networks.lab.vxlan.underlayMTU", "raise it to at least"}}},
		{"with evpn", strings.Replace(wgNet("{subnet: 10.255.0.0/24}", k1, k2), "      vni: 120\n", "      vni: 120\n      evpn: {asn: 65010}\n", 1),
			[]want{{6, "networks.lab.vxlan.evpn", "and wireguard together are not supported yet"}}},
		{"two segments, one port", wgNet("{subnet: 10.255.0.0/24}", k1, k2) +
			"  lab2:\n    mode: host\n    gateway: 10.8.0.1\n    netmask: 255.255.255.0\n    vxlan: {vni: 5, wireguard: {subnet: 10.255.1.0/24}, hosts: [{name: a, address: 10.0.0.1, publicKey: \"" + k1 + "\"}]}\n",
			[]want{{12, "networks.lab2.vxlan.wireguard", `port 51820 is also network "lab"'s`}}},
		{"two segments, one subnet", wgNet("{subnet: 10.255.0.0/16}", k1, k2) +
			"  lab2:\n    mode: host\n    gateway: 10.8.0.1\n    netmask: 255.255.255.0\n    vxlan: {vni: 5, wireguard: {port: 51821, subnet: 10.255.1.0/24}, hosts: [{name: a, address: 10.0.0.1, publicKey: \"" + k1 + "\"}]}\n",
			[]want{{12, "networks.lab2.vxlan.wireguard", `subnet 10.255.1.0/24 overlaps network "lab"'s 10.255.0.0/16`}}},
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
