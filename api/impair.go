package api

import (
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Impairment is what an attachment's link does to frames on purpose, to
// test how a guest copes (`impair` in a VM file's entry): the share of
// frames lost each way, in hundredths of a percent (1000 is 10%).
type Impairment struct {
	LossToVM   uint32 `json:"lossToVM,omitempty"`
	LossFromVM uint32 `json:"lossFromVM,omitempty"`
}

// LossScale is what a loss is counted out of: 10000, 100%.
const LossScale = 10000

// String is i as a VM file writes it: "loss toVM 10%, fromVM 0.5%"; ""
// for none.
func (i *Impairment) String() string {
	if i == nil {
		return ""
	}
	var parts []string
	if i.LossToVM > 0 {
		parts = append(parts, "toVM "+FormatLoss(i.LossToVM))
	}
	if i.LossFromVM > 0 {
		parts = append(parts, "fromVM "+FormatLoss(i.LossFromVM))
	}
	if len(parts) == 0 {
		return ""
	}
	return "loss " + strings.Join(parts, ", ")
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

// impair reads an entry's `impair:`: `loss: 10%` (frames to the VM, as
// netem on the host's end of the link would lose them) or `loss: {toVM:
// 10%, fromVM: 1%}`.
func (w *walker) impair(v *yaml.Node, path string) *Impairment {
	i := &Impairment{}
	lossAt := joinPath(path, "loss")
	loss := func(dst *uint32) fieldFunc {
		return func(_, n *yaml.Node, p string) {
			s, ok := w.str(n, p)
			if !ok {
				return
			}
			if *dst, ok = ParseLoss(s); !ok {
				w.errorf(n, p, "%q is not a loss: a percentage from 0%% to 100%%, at most two decimals (10%%, 0.5%%)", s)
			}
		}
	}
	unsupported := func(_, n *yaml.Node, p string) {
		w.errorf(n, p, "is not impaired by vmnetctl, which loses frames alone: delay, jitter, duplication and reordering need the kernel's netem, which vmnetctl does not drive yet")
	}
	ok := w.mapping(v, path, map[string]fieldFunc{
		"delay": unsupported, "jitter": unsupported, "duplicate": unsupported, "reorder": unsupported,
		"loss": func(_, n *yaml.Node, p string) {
			if deref(n).Kind == yaml.ScalarNode {
				loss(&i.LossToVM)(nil, n, p)
				return
			}
			w.mapping(n, p, map[string]fieldFunc{"toVM": loss(&i.LossToVM), "fromVM": loss(&i.LossFromVM)}, false)
		},
	}, false)
	if n := deref(v); ok && n.Kind == yaml.MappingNode && len(n.Content) == 0 {
		w.errorf(v, lossAt, "impairs nothing: give a loss (loss: 10%%, or loss: {toVM: 10%%, fromVM: 1%%})")
	}
	return i
}
