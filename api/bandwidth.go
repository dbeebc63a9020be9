package api

import (
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Bandwidth limits what an attachment's VM is sent and may send, each
// direction a rate in bits per second (0: no limit) with one burst for
// both. A VM file entry's `bandwidth: {toVM: 100Mbit, fromVM: 20Mbit,
// burst: 256KiB}`.
type Bandwidth struct {
	// ToVM is the rate of what the network sends the VM; FromVM of what
	// the VM sends, in bits per second.
	ToVM   uint64 `json:"toVM,omitempty"`
	FromVM uint64 `json:"fromVM,omitempty"`
	// Burst is how many bytes may pass at once above the rate, in each
	// direction; 0 is BurstFor's default.
	Burst uint64 `json:"burst,omitempty"`
}

// MinRate and MaxRate bound a bandwidth limit: the kernel's token bucket
// holds at most 4 s of its rate (maxBurstTime), which must hold MinBurst;
// its rates count bytes a second in 32 bits.
const (
	MinRate = 512_000
	MaxRate = 32_000_000_000
)

// maxBurstTime is the most a burst may hold at its rate: a token
// bucket's buffer is a time, in 32 bits of nanoseconds.
const maxBurstTime = 4

// MinBurst and MaxBurst bound a burst: it must hold the largest frame a
// port passes (64 KiB with segmentation offloads, and its headers), and
// more than a few hundred megabytes is no limit.
const (
	MinBurst = 128 << 10
	MaxBurst = 256 << 20
)

// BurstFor is the burst of a limit of rate bits per second: b.Burst if
// set, else what the rate sends in 10 ms, and at least MinBurst.
func (b *Bandwidth) BurstFor(rate uint64) uint64 {
	if b.Burst > 0 {
		return b.Burst
	}
	return max(rate/8/100, MinBurst)
}

// String is b as a VM file writes it: "toVM 100Mbit, fromVM 20Mbit",
// with the burst when set; "" for no limit.
func (b *Bandwidth) String() string {
	if b == nil {
		return ""
	}
	var parts []string
	if b.ToVM > 0 {
		parts = append(parts, "toVM "+FormatRate(b.ToVM))
	}
	if b.FromVM > 0 {
		parts = append(parts, "fromVM "+FormatRate(b.FromVM))
	}
	if b.Burst > 0 {
		parts = append(parts, "burst "+FormatBytes(b.Burst))
	}
	return strings.Join(parts, ", ")
}

// FormatRate writes bits per second with the largest SI unit that divides
// them ("100Mbit", "1500kbit", "8000bit").
func FormatRate(bps uint64) string {
	for _, u := range rateUnits {
		if bps%u.mult == 0 && bps >= u.mult {
			return strconv.FormatUint(bps/u.mult, 10) + u.name
		}
	}
	return strconv.FormatUint(bps, 10) + "bit"
}

// FormatBytes is a size as a VM file writes it: "8MiB", "256KiB".
func FormatBytes(n uint64) string {
	for _, u := range byteUnits {
		if u.mult > 1 && n%u.mult == 0 {
			return strconv.FormatUint(n/u.mult, 10) + u.name
		}
	}
	return strconv.FormatUint(n, 10) + "B"
}

type unit struct {
	name string
	mult uint64
}

// rateUnits are tc's (and incus's) units of bits per second, largest first.
var rateUnits = []unit{{"Tbit", 1e12}, {"Gbit", 1e9}, {"Mbit", 1e6}, {"kbit", 1e3}, {"bit", 1}}

// byteUnits are sizes in bytes, binary and decimal, largest first.
var byteUnits = []unit{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1}}

// parseWithUnit reads a number with one of units (any case) after it.
// ParseBytes reads a size in bytes as a VM file writes them: "256KiB",
// "8MiB", "1MB", "4096".
func ParseBytes(s string) (uint64, bool) { return parseWithUnit(s, byteUnits) }

func parseWithUnit(s string, units []unit) (uint64, bool) {
	s = strings.TrimSpace(s)
	for _, u := range units {
		if num, ok := cutSuffixFold(s, u.name); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(num), 10, 64)
			if err != nil || n > (1<<63)/u.mult {
				return 0, false
			}
			return n * u.mult, true
		}
	}
	return 0, false
}

func cutSuffixFold(s, suffix string) (string, bool) {
	if len(s) < len(suffix) || !strings.EqualFold(s[len(s)-len(suffix):], suffix) {
		return s, false
	}
	return s[:len(s)-len(suffix)], true
}

// quantity is a field of a number with a unit, within bounds.
type quantity struct {
	units    []unit
	min, max uint64
	format   func(uint64) string
	what     string // "a rate in bits per second like 100Mbit, ..."
}

var (
	rateQuantity  = quantity{rateUnits, MinRate, MaxRate, FormatRate, "a rate in bits per second like 100Mbit, 1Gbit or 500kbit"}
	burstQuantity = quantity{byteUnits, MinBurst, MaxBurst, FormatBytes, "a size in bytes like 256KiB or 1MB"}
)

// field reads q into dst.
func (q quantity) field(w *walker, dst *uint64) fieldFunc {
	return func(_, n *yaml.Node, p string) {
		s, ok := w.str(n, p)
		if !ok {
			return
		}
		v, ok := parseWithUnit(s, q.units)
		switch {
		case !ok:
			w.errorf(n, p, "%q is not %s", s, q.what)
		case v < q.min || v > q.max:
			w.errorf(n, p, "%s is outside %s-%s", q.format(v), q.format(q.min), q.format(q.max))
		default:
			*dst = v
		}
	}
}

// bandwidth reads an entry's `bandwidth:`.
func (w *walker) bandwidth(v *yaml.Node, path string) *Bandwidth {
	b := &Bandwidth{}
	ok := w.mapping(v, path, map[string]fieldFunc{
		"toVM":   rateQuantity.field(w, &b.ToVM),
		"fromVM": rateQuantity.field(w, &b.FromVM),
		"burst":  burstQuantity.field(w, &b.Burst),
	}, false)
	if ok && b.ToVM == 0 && b.FromVM == 0 {
		w.errorf(v, path, "limits nothing: give toVM, fromVM or both (a rate like 100Mbit)")
	}
	for _, r := range []uint64{b.ToVM, b.FromVM} {
		if r > 0 && b.Burst > r/8*maxBurstTime {
			w.errorf(v, joinPath(path, "burst"), "%s is more than %d s at %s: the kernel's token bucket holds at most that; lower the burst or raise the rate", FormatBytes(b.Burst), maxBurstTime, FormatRate(r))
			break
		}
	}
	return b
}
