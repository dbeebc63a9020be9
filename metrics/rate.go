package metrics

import (
	"net/netip"
	"time"

	"github.com/vmnetctl/vmnetctl/helperproto"
)

// Meter keeps a helper's two latest stats lines, to tell its current rates.
// The zero Meter is ready to use.
type Meter struct {
	prev, last helperproto.Stats
}

// Add records a stats line. Lines without a time, or older than the latest,
// are ignored: they cannot give a rate.
func (m *Meter) Add(s helperproto.Stats) {
	if s.Time.IsZero() || !s.Time.After(m.last.Time) {
		return
	}
	m.prev, m.last = m.last, s
}

// Last is the latest stats line recorded.
func (m *Meter) Last() helperproto.Stats { return m.last }

// Rates are bits per second over the interval between two stats lines.
type Rates struct {
	// ToVM is what the helper forwarded to the VM; FromVM what the VM sent.
	ToVM, FromVM float64
}

// Rates are the rates between the two latest stats lines, or zero when
// there are fewer than two, the counters went back (a new process), or the
// latest line is older than maxAge at now (the helper stopped reporting; its
// last rate would be a lie).
func (m *Meter) Rates(now time.Time, maxAge time.Duration) Rates {
	if m.prev.Time.IsZero() || now.Sub(m.last.Time) > maxAge {
		return Rates{}
	}
	secs := m.last.Time.Sub(m.prev.Time).Seconds()
	return Rates{ToVM: bitsPerSecond(m.prev.Host.Bytes, m.last.Host.Bytes, secs),
		FromVM: bitsPerSecond(m.prev.VM.Bytes, m.last.VM.Bytes, secs)}
}

func bitsPerSecond(before, after uint64, secs float64) float64 {
	if after < before || secs <= 0 {
		return 0
	}
	return float64(after-before) * 8 / secs
}

// PoolSize is the number of addresses from start to end, both included; 0
// when either is missing or end comes before start.
func PoolSize(start, end netip.Addr) uint64 {
	if !start.IsValid() || !end.IsValid() || start.BitLen() != end.BitLen() || end.Less(start) {
		return 0
	}
	a, b := start.As16(), end.As16()
	// Only the low 64 bits can differ in any pool worth counting; a wider
	// IPv6 range saturates.
	for i := 0; i < 8; i++ {
		if a[i] != b[i] {
			return ^uint64(0)
		}
	}
	var lo, hi uint64
	for i := 8; i < 16; i++ {
		lo, hi = lo<<8|uint64(a[i]), hi<<8|uint64(b[i])
	}
	if hi-lo == ^uint64(0) {
		return hi - lo
	}
	return hi - lo + 1
}
