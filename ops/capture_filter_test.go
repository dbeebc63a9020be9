package ops

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestCompileFilter: `capture --filter` compiles with libpcap (tcpdump
// -ddd) what tcpdump and Wireshark take, says what is wrong with what
// they do not, and takes an expression that looks like an option as an
// expression (it writes no file).
func TestCompileFilter(t *testing.T) {
	testutil.RequireCommands(t, "tcpdump")
	p, err := CompileFilter(context.Background(), "icmp")
	if err != nil {
		t.Fatal(err)
	}
	if got := ctlapi.EncodeFilter(p); got != "6,40 0 0 12,21 0 3 2048,48 0 0 23,21 0 1 1,6 0 0 262144,6 0 0 0" {
		t.Errorf("icmp compiled to %s", got)
	}
	if p, err := CompileFilter(context.Background(), "tcp port 443 and host 10.0.0.5 or arp"); err != nil || len(p) < 10 {
		t.Errorf("a longer filter: %d instructions, %v", len(p), err)
	}
	if _, err := CompileFilter(context.Background(), "tcp port"); err == nil || !strings.Contains(err.Error(), `--filter "tcp port": can't parse filter expression`) {
		t.Errorf("a filter with a syntax error: %v", err)
	}
	out := filepath.Join(t.TempDir(), "x")
	if _, err := CompileFilter(context.Background(), "-w "+out); err == nil {
		t.Errorf("an expression that looks like an option compiled")
	}
	if _, err := os.Stat(out); err == nil {
		t.Errorf("an expression that looks like an option wrote %s", out)
	}
	if _, err := CompileFilter(context.Background(), strings.Repeat("icmp or ", 1000)); err == nil || !strings.Contains(err.Error(), "at most 4096") {
		t.Errorf("a filter of 8,000 bytes: %v", err)
	}
}
