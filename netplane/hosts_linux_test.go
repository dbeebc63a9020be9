package netplane

import (
	"fmt"
	"net/netip"
	"testing"
)

// BenchmarkResolve measures the DNS proxy's lookup of a DHCP host name on a
// network with many leases.
func BenchmarkResolve(b *testing.B) {
	for _, n := range []int{1_000, 60_000} {
		b.Run(fmt.Sprintf("leases=%d", n), func(b *testing.B) {
			a := bigAllocator(b, n)
			defer a.Close()
			mac := mustMAC("52:56:00:00:00:01")
			off, err := a.Offer(mac, netip.Addr{})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := a.Commit(mac, off, "target"); err != nil {
				b.Fatal(err)
			}
			resolve := resolver(newHostTable(), a)
			for b.Loop() {
				if ip, ok := resolve("target"); !ok || ip != off {
					b.Fatalf("target resolved to %v, %v; want %s", ip, ok, off)
				}
			}
		})
	}
}
