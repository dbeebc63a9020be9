package api

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Impairment is what an attachment's link does to frames on purpose, to
// test how a guest copes (`impair` in a VM file's entry), each way: the
// share of frames lost, in hundredths of a percent (1000 is 10%), by the
// kernel (nftables); and the shaping the helper does in its relay (Shaped:
// the kernel's netem would, and this project's development kernel has
// none): a delay, give or take a jitter, and the shares of frames
// duplicated and reordered (sent at once, past the delayed ones), in
// hundredths of a percent too.
type Impairment struct {
	LossToVM        uint32        `json:"lossToVM,omitempty"`
	LossFromVM      uint32        `json:"lossFromVM,omitempty"`
	DelayToVM       time.Duration `json:"delayToVM,omitempty"`
	DelayFromVM     time.Duration `json:"delayFromVM,omitempty"`
	JitterToVM      time.Duration `json:"jitterToVM,omitempty"`
	JitterFromVM    time.Duration `json:"jitterFromVM,omitempty"`
	DuplicateToVM   uint32        `json:"duplicateToVM,omitempty"`
	DuplicateFromVM uint32        `json:"duplicateFromVM,omitempty"`
	ReorderToVM     uint32        `json:"reorderToVM,omitempty"`
	ReorderFromVM   uint32        `json:"reorderFromVM,omitempty"`
}

// LossScale is what a loss (and a duplicated or reordered share) is
// counted out of: 10000, 100%.
const LossScale = 10000

// MaxDelay bounds a delay and a jitter.
const MaxDelay = time.Minute

// Shaped says whether i asks the helper for anything: a delay, jitter,
// duplication or reordering, either way.
func (i *Impairment) Shaped() bool {
	return i != nil && (i.DelayToVM|i.DelayFromVM|i.JitterToVM|i.JitterFromVM != 0 ||
		i.DuplicateToVM|i.DuplicateFromVM|i.ReorderToVM|i.ReorderFromVM != 0)
}

// String is i as a VM file writes it, a kind of impairment after the
// other: "loss toVM 10%, fromVM 0.5%; delay toVM 50ms; jitter toVM 5ms";
// "" for none.
func (i *Impairment) String() string {
	if i == nil {
		return ""
	}
	var kinds []string
	for _, k := range []struct {
		name         string
		toVM, fromVM string
	}{
		{"loss", share(i.LossToVM), share(i.LossFromVM)},
		{"delay", duration(i.DelayToVM), duration(i.DelayFromVM)},
		{"jitter", duration(i.JitterToVM), duration(i.JitterFromVM)},
		{"duplicate", share(i.DuplicateToVM), share(i.DuplicateFromVM)},
		{"reorder", share(i.ReorderToVM), share(i.ReorderFromVM)},
	} {
		var parts []string
		if k.toVM != "" {
			parts = append(parts, "toVM "+k.toVM)
		}
		if k.fromVM != "" {
			parts = append(parts, "fromVM "+k.fromVM)
		}
		if len(parts) > 0 {
			kinds = append(kinds, k.name+" "+strings.Join(parts, ", "))
		}
	}
	return strings.Join(kinds, "; ")
}

// share and duration are a share and a duration as String writes them,
// "" for none.
func share(v uint32) string {
	if v == 0 {
		return ""
	}
	return FormatLoss(v)
}

func duration(d time.Duration) string {
	if d == 0 {
		return ""
	}
	return d.String()
}

// Check says what is wrong with i (one a request made rather than a
// file: `vmnetctl impair`): a share over 100%, a delay over MaxDelay, a
// jitter larger than its delay, reordering without a delay to pass.
func (i *Impairment) Check() error {
	for _, d := range []struct {
		way                string
		loss, dup, reorder uint32
		delay, jitter      time.Duration
	}{
		{"toVM", i.LossToVM, i.DuplicateToVM, i.ReorderToVM, i.DelayToVM, i.JitterToVM},
		{"fromVM", i.LossFromVM, i.DuplicateFromVM, i.ReorderFromVM, i.DelayFromVM, i.JitterFromVM},
	} {
		switch {
		case d.loss > LossScale || d.dup > LossScale || d.reorder > LossScale:
			return fmt.Errorf("%s: a share is at most 100%%", d.way)
		case d.delay < 0 || d.delay > MaxDelay:
			return fmt.Errorf("%s: a delay is from 0 to %v", d.way, MaxDelay)
		case d.jitter < 0 || d.jitter > d.delay:
			return fmt.Errorf("%s: a jitter of %v is more than its delay (%v)", d.way, d.jitter, d.delay)
		case d.reorder > 0 && d.delay == 0:
			return fmt.Errorf("%s: reordering needs a delay, for the reordered frames to pass", d.way)
		}
	}
	return nil
}

// FormatLoss is a loss in hundredths of a percent as a percentage:
// "10%", "0.25%".
func FormatLoss(v uint32) string {
	return strconv.FormatFloat(float64(v)/100, 'f', -1, 64) + "%"
}

// ParseLoss reads a percentage of at most two decimals: "10%", "0.5%",
// "100%", in hundredths of a percent.
func ParseLoss(s string) (uint32, bool) {
	num, ok := strings.CutSuffix(strings.TrimSpace(s), "%")
	if !ok {
		return 0, false
	}
	whole, frac, dot := strings.Cut(num, ".")
	if whole == "" || len(frac) > 2 || dot && frac == "" {
		return 0, false
	}
	for len(frac) < 2 {
		frac += "0"
	}
	w, err1 := strconv.ParseUint(whole, 10, 32)
	f, err2 := strconv.ParseUint(frac, 10, 32)
	if err1 != nil || err2 != nil || w > 100 {
		return 0, false
	}
	v := uint32(w*100 + f)
	return v, v <= LossScale
}

// ParseDelay reads a delay or a jitter: a duration from 0 to MaxDelay
// ("50ms", "1.5ms", "1s").
func ParseDelay(s string) (time.Duration, bool) {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	return d, err == nil && d >= 0 && d <= MaxDelay
}

// impair reads an entry's `impair:`: `loss: 10%` (frames to the VM, as
// netem on the host's end of the link would lose them) or `loss: {toVM:
// 10%, fromVM: 1%}`; and so delay and jitter (durations), duplicate and
// reorder (percentages).
func (w *walker) impair(v *yaml.Node, path string) *Impairment {
	i := &Impairment{}
	// each reads a kind's value: one for the frames to the VM, or a
	// mapping with toVM and fromVM.
	each := func(read func(dst any) fieldFunc, toVM, fromVM any) fieldFunc {
		return func(_, n *yaml.Node, p string) {
			if deref(n).Kind == yaml.ScalarNode {
				read(toVM)(nil, n, p)
				return
			}
			w.mapping(n, p, map[string]fieldFunc{"toVM": read(toVM), "fromVM": read(fromVM)}, false)
		}
	}
	pct := func(dst any) fieldFunc {
		return func(_, n *yaml.Node, p string) {
			s, ok := w.str(n, p)
			if !ok {
				return
			}
			v, ok := ParseLoss(s)
			if !ok {
				what := "a loss"
				if !strings.HasSuffix(p, ".loss") && !strings.Contains(p, ".loss.") {
					what = "a share"
				}
				w.errorf(n, p, "%q is not %s: a percentage from 0%% to 100%%, at most two decimals (10%%, 0.5%%)", s, what)
				return
			}
			*dst.(*uint32) = v
		}
	}
	dur := func(dst any) fieldFunc {
		return func(_, n *yaml.Node, p string) {
			s, ok := w.str(n, p)
			if !ok {
				return
			}
			d, ok := ParseDelay(s)
			if !ok {
				w.errorf(n, p, "%q is not a delay: a duration from 0 to %v (50ms, 1.5ms, 1s)", s, MaxDelay)
				return
			}
			*dst.(*time.Duration) = d
		}
	}
	nodes := map[string]*yaml.Node{}
	seen := func(name string, f fieldFunc) fieldFunc {
		return func(k, n *yaml.Node, p string) {
			nodes[name] = n
			f(k, n, p)
		}
	}
	errsBefore := len(w.diags.Errors())
	ok := w.mapping(v, path, map[string]fieldFunc{
		"loss":      seen("loss", each(pct, &i.LossToVM, &i.LossFromVM)),
		"delay":     seen("delay", each(dur, &i.DelayToVM, &i.DelayFromVM)),
		"jitter":    seen("jitter", each(dur, &i.JitterToVM, &i.JitterFromVM)),
		"duplicate": seen("duplicate", each(pct, &i.DuplicateToVM, &i.DuplicateFromVM)),
		"reorder":   seen("reorder", each(pct, &i.ReorderToVM, &i.ReorderFromVM)),
		"rate": func(_, n *yaml.Node, p string) {
			w.errorf(n, p, "is the entry's bandwidth, beside impair (bandwidth: {toVM: 100Mbit, fromVM: 20Mbit}), which the kernel enforces")
		},
	}, false)
	if n := deref(v); ok && n.Kind == yaml.MappingNode && len(n.Content) == 0 {
		w.errorf(v, joinPath(path, "loss"), "impairs nothing: give a loss (loss: 10%%, or loss: {toVM: 10%%, fromVM: 1%%}), a delay, jitter, duplicate or reorder")
	}
	if len(w.diags.Errors()) == errsBefore {
		for _, d := range []struct {
			way           string
			delay, jitter time.Duration
			reorder       uint32
		}{{"toVM", i.DelayToVM, i.JitterToVM, i.ReorderToVM}, {"fromVM", i.DelayFromVM, i.JitterFromVM, i.ReorderFromVM}} {
			switch {
			case d.jitter > d.delay:
				w.errorf(nodes["jitter"], joinPath(path, "jitter"), "%s: a jitter of %v is more than the delay (%v): a frame is never sent before it came", d.way, d.jitter, d.delay)
			case d.reorder > 0 && d.delay == 0:
				w.errorf(nodes["reorder"], joinPath(path, "reorder"), "%s: reordering sends some frames at once, past delayed ones: it needs a delay", d.way)
			}
		}
	}
	return i
}
