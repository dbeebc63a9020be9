package netplane

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/leases"
	"github.com/vmnetctl/vmnetctl/leases/leasestest"
)

// bigAllocator returns an allocator of a /16 whose lease file holds n
// unexpired leases on the first n addresses of the range, loaded the way
// vmnetctl loads them after a restart.
func bigAllocator(tb testing.TB, n int) *leases.Allocator {
	tb.Helper()
	nw := testNet("big", api.ModeHost, "10.8.0.0/16")
	nw.LeaseTime = time.Hour
	var ls []leases.Lease
	addr := nw.DHCPStart
	for i := range n {
		ls = append(ls, leases.Lease{MAC: fmt.Sprintf("52:55:%02x:%02x:%02x:%02x", i>>24&0xff, i>>16&0xff, i>>8&0xff, i&0xff),
			IP: addr, Expiry: guardNow.Add(time.Hour)})
		addr = addr.Next()
	}
	data, err := json.Marshal(map[string]any{"network": nw.ID, "subnet": nw.Subnet.String(), "leases": ls})
	if err != nil {
		tb.Fatal(err)
	}
	path := filepath.Join(tb.TempDir(), "big.leases.json")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		tb.Fatal(err)
	}
	a := leasestest.MustAllocator(tb, nw, path)
	a.SetClock(func() time.Time { return guardNow })
	return a
}

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

// TestReservedNames: a name a VM file defines on another network is no
// DHCP client's here: a guest that sends it as its host name does not get
// it answered, while other DHCP host names are.
func TestReservedNames(t *testing.T) {
	n := testNet("h", api.ModeHost, "10.9.8.0/24")
	a := leasestest.MustAllocator(t, n, "")
	lease := func(mac, host string) netip.Addr {
		t.Helper()
		hw := mustMAC(mac)
		off, err := a.Offer(hw, netip.Addr{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Commit(hw, off, host); err != nil {
			t.Fatal(err)
		}
		return off
	}
	lease("52:55:55:00:09:01", "db")
	web := lease("52:55:55:00:09:02", "web")
	lease("52:55:55:00:09:03", "WPAD")
	hosts := newHostTable()
	resolve := resolver(hosts, a)
	if _, ok := resolve("db"); !ok {
		t.Fatalf("db is not answered before it is reserved") // the control
	}
	hosts.reserve([]string{"DB", "other"})
	if ip, ok := resolve("db"); ok {
		t.Errorf("a DHCP client took the reserved name db: %s", ip)
	}
	if ip, ok := resolve("web"); !ok || ip != web {
		t.Errorf("web: %s, %v, want %s", ip, ok, web)
	}
	if ip, ok := resolve("wpad"); ok {
		t.Errorf("a DHCP client took wpad (other guests' proxy auto-configuration): %s", ip)
	}
}
