package testutil

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
)

// PrivateKB is process pid's private anonymous memory in kB, as
// /proc/PID/smaps_rollup counts it: what the process costs the host beyond
// the pages it shares with others (its program's text).
func PrivateKB(tb testing.TB, pid int) int {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		tb.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "Anonymous:" {
			kb, err := strconv.Atoi(f[1])
			if err != nil {
				tb.Fatalf("smaps_rollup of %d: %q", pid, l)
			}
			return kb
		}
	}
	tb.Fatalf("no Anonymous line in smaps_rollup of %d", pid)
	return 0
}
