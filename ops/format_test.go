package ops

import (
	"testing"
)

func TestFormatBits(t *testing.T) {
	for bps, want := range map[float64]string{0: "0", 0.4: "0", 950: "950 b/s", 999.6: "1.0 kb/s", 12345: "12.3 kb/s",
		123456: "123 kb/s", 12.3e6: "12.3 Mb/s", 9.99e9: "10.0 Gb/s", 2e15: "2000 Tb/s"} {
		if got := formatBits(bps); got != want {
			t.Errorf("formatBits(%v) = %q, want %q", bps, got, want)
		}
	}
}
