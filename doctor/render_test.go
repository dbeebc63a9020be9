package doctor

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestRenderCountsProblems: the report counts its problems in words: "1
// problem found.", "2 problems found.", not "1 problem(s)". The reports
// whole, findings and fixes, are in testdata/render-N-problems.txt.
func TestRenderCountsProblems(t *testing.T) {
	findings := []Finding{
		{Check: "nftables", Status: OK, Detail: "nftables v1.0.6 (Lester Gooch #5)"},
		{Check: "/dev/net/tun", Status: Fail, Detail: "cannot open /dev/net/tun: no such file or directory",
			Fix: "load the tun module: sudo modprobe tun (and add tun to /etc/modules-load.d/ to keep it)"},
		{Check: "qemu", Status: Warn, Detail: "/usr/bin/qemu-system-x86_64 7.0.0: -netdev dgram needs qemu 7.2 or later",
			Fix: "upgrade qemu, or use `attach: tap` for this qemu (-netdev tap)"},
	}
	for n, want := range map[int]string{0: "No problems found.", 1: "1 problem found.", 2: "2 problems found."} {
		r := &Report{}
		for _, f := range findings[:n+1] {
			r.add(f)
		}
		if r.Problems != n {
			t.Fatalf("%d findings that warn or fail counted as %d", n, r.Problems)
		}
		var b strings.Builder
		if err := r.Render(&b); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(b.String(), want) {
			t.Errorf("%d problems: %q, want %q", n, b.String(), want)
		}
		testutil.Golden(t, filepath.Join("testdata", fmt.Sprintf("render-%d-problems.txt", n)), b.String())
	}
}
