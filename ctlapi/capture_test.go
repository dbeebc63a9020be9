package ctlapi

import (
	"strings"
	"testing"

	"golang.org/x/net/bpf"
)

// TestFilterCoding: a program goes through GET /v1/capture's filter
// parameter unchanged, tcpdump -ddd's lines read as its encoding, and a
// program the kernel would refuse is refused with what is wrong.
func TestFilterCoding(t *testing.T) {
	icmp := "6,40 0 0 12,21 0 3 2048,48 0 0 23,21 0 1 1,6 0 0 262144,6 0 0 0" // tcpdump -ddd -y EN10MB icmp
	p, err := DecodeFilter(icmp)
	if err != nil || len(p) != 6 || p[1] != (bpf.RawInstruction{Op: 21, Jt: 0, Jf: 3, K: 2048}) {
		t.Fatalf("DecodeFilter(icmp) = %v, %v", p, err)
	}
	if got := EncodeFilter(p); got != icmp {
		t.Errorf("EncodeFilter: %q, want %q", got, icmp)
	}
	for _, c := range []struct{ in, want string }{
		{"", "1 to 4096 instructions"},
		{"2,6 0 0 0", "1 to 4096 instructions"},
		{"4097" + strings.Repeat(",6 0 0 0", 4097), "1 to 4096 instructions"},
		{"1,6 0 0", `"6 0 0", is not "op jt jf k"`},
		{"1,65535 0 0 0", "none the kernel runs"},
		{"2,21 0 1 2048,6 0 0 0", "jumps past its end"},
		{"2,5 0 0 7,6 0 0 0", "jumps past its end"},
		{"1,40 0 0 12", "returns nothing"},
		{"1,6 0 0 4294967296", "is not"},
		{"1,6 0 0 1 garbage", "is not"},
		{"2,33 0 0 12,6 0 0 0", "none the kernel runs"},  // LDX ABS
		{"2,176 0 0 14,6 0 0 0", "none the kernel runs"}, // LD MSH
		{"2,52 0 0 0,6 0 0 0", "none the kernel runs"},   // DIV by 0
	} {
		if _, err := DecodeFilter(c.in); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("DecodeFilter(%.40q): %v, want %q", c.in, err, c.want)
		}
	}
}
