package testutil

import (
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
)

// Run runs a command and returns its combined output; it fails the test,
// with the output, if the command fails.
func Run(tb testing.TB, name string, args ...string) string {
	tb.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		tb.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// InRange returns an error unless addr is an IP address from first to last
// (both included): the exact check for a DHCP lease, where a string prefix
// would accept addresses outside the pool.
func InRange(addr, first, last string) error {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return fmt.Errorf("%q is not an IP address", addr)
	}
	lo, hi := netip.MustParseAddr(first), netip.MustParseAddr(last)
	if a.Compare(lo) < 0 || a.Compare(hi) > 0 {
		return fmt.Errorf("%s is not in %s-%s", addr, first, last)
	}
	return nil
}
