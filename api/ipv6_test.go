package api

import (
	"net/netip"
	"strings"
	"testing"
)

// TestIPv6 reads the IPv6 side of networks: a ULA /64 derived from the
// name (the same on every machine), `subnet6` when set, `ipv6: false`, and
// clear errors for prefixes that cannot be a network's.
func TestIPv6(t *testing.T) {
	// Golden: changing the derivation would renumber every user's VMs.
	if got := ULAPrefix("shared"); got != netip.MustParsePrefix("fd0a:2240:b645::/64") {
		t.Errorf("ULAPrefix(shared) = %s, want fd0a:2240:b645::/64 (stable across releases)", got)
	}
	if a, b := ULAPrefix("a"), ULAPrefix("b"); a == b || !ulaRange.Contains(a.Addr()) || a.Bits() != 64 {
		t.Errorf("ULAPrefix: a %s, b %s: want two /64s of fd00::/8", a, b)
	}
	nets := mustNetworks(t, `vmnet:
  shared:
    subnet: 10.1.0.0/24
  host:
    mode: host
    subnet: 10.2.0.0/24
    subnet6: fd12:3456:789a:1::/64
  off:
    subnet: 10.3.0.0/24
    ipv6: false
  lan:
    mode: bridged
    interface: eth0
`)
	for _, c := range []struct {
		id          string
		subnet6, gw string
		nat66, ra   bool
	}{
		{"shared", "fd0a:2240:b645::/64", "fd0a:2240:b645::1", true, true},
		{"host", "fd12:3456:789a:1::/64", "fd12:3456:789a:1::1", false, true},
		{"off", "", "", false, false},
		{"lan", "", "", false, false},
	} {
		n := nets.Get(c.id)
		got6, gotGW := "", ""
		if n.Subnet6.IsValid() {
			got6, gotGW = n.Subnet6.String(), n.Gateway6.String()
		}
		if got6 != c.subnet6 || gotGW != c.gw || n.NAT66 != c.nat66 || n.RouterAdvertisement != c.ra || n.HasIPv6() != (c.subnet6 != "") {
			t.Errorf("%s: subnet6 %q gateway6 %q nat66 %v ra %v, want %q %q %v %v", c.id, got6, gotGW, n.NAT66, n.RouterAdvertisement, c.subnet6, c.gw, c.nat66, c.ra)
		}
	}

	for _, c := range []struct{ name, src, want string }{
		{"not /64", "vmnet:\n  s:\n    subnet6: fd00:1::/48\n", "n.yaml:3: vmnet.s.subnet6: fd00:1::/48 is a /48: an IPv6 network is a /64"},
		{"not ULA", "vmnet:\n  s:\n    subnet6: 2001:db8::/64\n", "is not a unique local prefix (fd00::/8)"},
		{"host bits", "vmnet:\n  s:\n    subnet6: fd00:1::5/64\n", "has host bits set; the network is fd00:1::/64"},
		{"IPv4", "vmnet:\n  s:\n    subnet6: 10.0.0.0/24\n", `"10.0.0.0/24" is not an IPv6 prefix`},
		{"same prefix", "vmnet:\n  a:\n    subnet: 10.1.0.0/24\n    subnet6: fd00:1::/64\n  b:\n    subnet: 10.2.0.0/24\n    subnet6: fd00:1::/64\n", `n.yaml:7: vmnet.b.subnet6: IPv6 prefix fd00:1::/64 is also network "a"'s (line 2)`},
		{"MTU", "vmnet:\n  s:\n    mtu: 1000\n    subnet6: fd00:1::/64\n", "IPv6 needs an MTU of at least 1280; the network's is 1000"},
		{"bridged", "vmnet:\n  lan:\n    mode: bridged\n    interface: eth0\n    subnet6: fd00:1::/64\n", "a bridged network has no subnet6"},
	} {
		_, diags := LoadNetworks("n.yaml", []byte(c.src))
		if err := diags.Err(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
}
