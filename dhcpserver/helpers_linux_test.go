package dhcpserver

import (
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/leases"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// testNet and mustMAC are the fixtures of testutil.
var (
	testNet = testutil.Network
	mustMAC = testutil.MAC
)

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
