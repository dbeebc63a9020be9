// Package leasestest has the test helpers of the lease store that the
// packages built on it share (dhcpserver, netplane): the store's own
// tests, which see its insides, keep theirs.
package leasestest

import (
	"net/netip"
	"testing"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/leases"
)

// MustAllocator is leases.NewAllocator(n, path) that fails the test on
// error.
func MustAllocator(tb testing.TB, n *api.Network, path string) *leases.Allocator {
	tb.Helper()
	a, err := leases.NewAllocator(n, path)
	if err != nil {
		tb.Fatal(err)
	}
	return a
}

// CheckLeases fails when two live leases share an address.
func CheckLeases(tb testing.TB, a *leases.Allocator) {
	tb.Helper()
	seen := map[netip.Addr]string{}
	for _, l := range a.Leases() {
		if m, dup := seen[l.IP]; dup {
			tb.Fatalf("%s is leased to both %s and %s", l.IP, m, l.MAC)
		}
		seen[l.IP] = l.MAC
	}
}
