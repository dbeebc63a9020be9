package netplane

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
)

func testNet(id string, mode api.Mode, cidr string) *api.Network {
	p := netip.MustParsePrefix(cidr)
	gw := p.Addr().Next()
	return &api.Network{
		ID: id, Name: id, Section: api.SectionVMNet, Mode: mode,
		Subnet: p, Gateway: gw, DHCPStart: gw.Next(), DHCPEnd: broadcast(p).Prev(),
		MTU: 1400, DHCP: true, DNSProxy: true, NAT44: mode == api.ModeShared,
		LeaseTime: time.Minute,
	}
}

// broadcast is the last address of p.
func broadcast(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 1
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3]) | host
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func TestLocalName(t *testing.T) {
	for _, tc := range []struct {
		q            string
		name         string
		inZone, isOK bool
	}{
		{"vm1.vmnet.internal.", "vm1", true, true},
		{"VM1.VMNET.Internal.", "vm1", true, true},
		{"a.b.vmnet.internal.", "", true, false},
		{"vmnet.internal.", "", true, false},
		{"vm1.", "vm1", false, true},
		{"example.com.", "", false, false},
	} {
		name, inZone, ok := localName(tc.q)
		if name != tc.name || inZone != tc.inZone || ok != tc.isOK {
			t.Errorf("localName(%q) = %q, %v, %v; want %q, %v, %v", tc.q, name, inZone, ok, tc.name, tc.inZone, tc.isOK)
		}
	}
}

func TestNFTRules(t *testing.T) {
	n := testNet("s", api.ModeShared, "10.9.0.0/24")
	r := nftRules(n)
	if !slices.Contains(r["postrouting"], `ip saddr 10.9.0.0/24 oifname != "vmn-s" masquerade`) || len(r["input"]) != 4 {
		t.Errorf("shared rules: %q", r)
	}
	h := testNet("h", api.ModeHost, "10.9.1.0/24")
	h.DNSProxy = false
	r = nftRules(h)
	for _, rule := range r["postrouting"] {
		if strings.Contains(rule, "oifname != ") {
			t.Errorf("host network masquerades what leaves it: %q", rule)
		}
	}
	if len(r["input"]) != 3 || slices.ContainsFunc(r["input"], func(s string) bool { return strings.Contains(s, "dport 53") }) {
		t.Errorf("host network without DNS proxy: input %q", r["input"])
	}
}
