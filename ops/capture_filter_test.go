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
	// What tcpdump writes for the language's corners decodes: ALU with
	// X, ldx msh, ld #len, ret a, long jumps, VLAN tags.
	for _, expr := range []string{"vlan and tcp", "ip[2:2] > 576", "ether[0] & 1 != 0", "tcp[tcpflags] & tcp-syn != 0",
		"ip6 and udp port 53", "len > 100", "ip[0] & 0xf > 5 and ip[2:2] / 4 > 10", "portrange 1000-2000 or net 10.0.0.0/8"} {
		if _, err := CompileFilter(context.Background(), expr); err != nil {
			t.Errorf("%s: %v", expr, err)
		}
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
