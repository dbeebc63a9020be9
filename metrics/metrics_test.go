package metrics

import (
	"net/netip"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/helperproto"
)

func stats(t time.Time, toVM, fromVM uint64) helperproto.Stats {
	return helperproto.Stats{Time: t, Host: helperproto.Counters{Bytes: toVM}, VM: helperproto.Counters{Bytes: fromVM}}
}

func TestMeterRates(t *testing.T) {
	t0 := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	sec := func(n float64) time.Time { return t0.Add(time.Duration(n * float64(time.Second))) }
	tests := []struct {
		name  string
		lines []helperproto.Stats
		now   time.Time
		want  Rates
	}{
		{"no line", nil, sec(1), Rates{}},
		{"one line", []helperproto.Stats{stats(sec(0), 100, 100)}, sec(1), Rates{}},
		{"two lines", []helperproto.Stats{stats(sec(0), 1000, 0), stats(sec(2), 3000, 500)}, sec(2), Rates{ToVM: 8000, FromVM: 2000}},
		{"the latest two count", []helperproto.Stats{stats(sec(0), 0, 0), stats(sec(1), 1e6, 0), stats(sec(2), 1e6, 0)}, sec(2), Rates{}},
		{"stale", []helperproto.Stats{stats(sec(0), 0, 0), stats(sec(1), 1000, 1000)}, sec(30), Rates{}},
		{"counters went back", []helperproto.Stats{stats(sec(0), 5000, 5000), stats(sec(1), 10, 6000)}, sec(1), Rates{ToVM: 0, FromVM: 8000}},
		{"a line out of order is ignored", []helperproto.Stats{stats(sec(0), 0, 0), stats(sec(2), 2000, 0), stats(sec(1), 1000, 0)}, sec(2), Rates{ToVM: 8000}},
		{"a line without a time is ignored", []helperproto.Stats{stats(sec(0), 0, 0), stats(time.Time{}, 9, 9), stats(sec(1), 1000, 0)}, sec(1), Rates{ToVM: 8000}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var m Meter
			for _, s := range tt.lines {
				m.Add(s)
			}
			if got := m.Rates(tt.now, 5*time.Second); got != tt.want {
				t.Errorf("Rates = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestPoolSize(t *testing.T) {
	tests := []struct {
		start, end string
		want       uint64
	}{
		{"10.0.0.2", "10.0.0.254", 253},
		{"10.0.0.2", "10.0.0.2", 1},
		{"10.0.0.9", "10.0.0.2", 0},
		{"10.0.0.0", "10.0.255.255", 65536},
		{"fd00::2", "fd00::ff", 254},
		{"fd00::1", "fd01::1", ^uint64(0)},
		{"10.0.0.1", "fd00::1", 0},
		{"", "10.0.0.1", 0},
	}
	for _, tt := range tests {
		start, _ := netip.ParseAddr(tt.start)
		end, _ := netip.ParseAddr(tt.end)
		if got := PoolSize(start, end); got != tt.want {
			t.Errorf("PoolSize(%s, %s) = %d, want %d", tt.start, tt.end, got, tt.want)
		}
	}
}
