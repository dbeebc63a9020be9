package testutil

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
)

// Network is a network of subnet cidr for the data plane's tests, as
// networks.yaml would give it: gateway .1, a DHCP range from .2 to the
// last address but one, MTU 1400, DHCP and the DNS proxy on, NAT44 on a
// shared network, leases of a minute.
func Network(id string, mode api.Mode, cidr string) *api.Network {
	p := netip.MustParsePrefix(cidr)
	gw := p.Addr().Next()
	return &api.Network{
		ID: id, Name: id, Section: api.SectionVMNet, Mode: mode,
		Subnet: p, Gateway: gw, DHCPStart: gw.Next(), DHCPEnd: Broadcast(p).Prev(),
		MTU: 1400, DHCP: true, DNSProxy: true, NAT44: mode == api.ModeShared,
		LeaseTime: time.Minute,
	}
}

// Broadcast is the last address of p.
func Broadcast(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 1
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3]) | host
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// MAC is s parsed; it panics on a bad one (a test's constant).
func MAC(s string) net.HardwareAddr {
	hw, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return hw
}

// FuzzNow is the lease store's clock in the DHCP and lease fuzzers: leases
// expire (or not) the same way on every run.
var FuzzNow = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// FuzzFixedMAC is the MAC FuzzNetwork(0) reserves an address for.
const FuzzFixedMAC = "52:55:55:00:00:99"

// FuzzNetwork is a network the DHCP and lease fuzzers run against, chosen
// by cfg:
//
//   - 0: 10.9.0.0/24, gateway .1, DHCP range .100-.150, the reservation
//     FuzzFixedMAC → .20 (outside the range, as reservations may be);
//   - 1: 10.9.1.0/29, gateway .1, a DHCP range that is the whole subnet,
//     network, gateway and broadcast address included: the allocator must
//     skip them itself, and five addresses run out fast.
func FuzzNetwork(cfg byte) *api.Network {
	ip := netip.MustParseAddr
	if cfg%2 == 0 {
		n := Network("f", api.ModeShared, "10.9.0.0/24")
		n.DHCPStart, n.DHCPEnd = ip("10.9.0.100"), ip("10.9.0.150")
		n.Reservations = []api.Reservation{{MAC: FuzzFixedMAC, IP: ip("10.9.0.20")}}
		return n
	}
	n := Network("g", api.ModeHost, "10.9.1.0/29")
	n.DHCPStart, n.DHCPEnd = ip("10.9.1.0"), ip("10.9.1.7")
	return n
}

// LoadNetworks parses a test's networks.yaml, failing the test on its
// errors.
func LoadNetworks(tb testing.TB, src string) *api.Networks {
	tb.Helper()
	nets, diags := api.LoadNetworks("networks.yaml", []byte(src))
	if diags.HasErrors() {
		tb.Fatal(diags)
	}
	return nets
}
