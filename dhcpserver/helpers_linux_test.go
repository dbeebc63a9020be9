package dhcpserver

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/leases"
)

// testNet is a network of subnet cidr for the server: gateway .1, DHCP
// range .2 to the last but one address, leases of a minute.
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

func mustMAC(s string) net.HardwareAddr {
	hw, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return hw
}

// mustAllocator is leases.NewAllocator(n, path) that fails the test on
// error.
func mustAllocator(tb testing.TB, n *api.Network, path string) *leases.Allocator {
	tb.Helper()
	a, err := leases.NewAllocator(n, path)
	if err != nil {
		tb.Fatal(err)
	}
	return a
}

// guardNow is the injected clock of the server's tests.
var guardNow = time.Unix(1_800_000_000, 0)

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }
