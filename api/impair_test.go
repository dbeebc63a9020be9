package api

import (
	"strings"
	"testing"
	"time"
)

// TestImpair: an entry's `impair` reads a loss to the VM, or each way;
// bad values are refused with their field and line; a bridged network's
// entry takes none.
func TestImpair(t *testing.T) {
	nets, _ := LoadNetworks("n.yaml", []byte("vmnet:\n  lan:\n    mode: bridged\n    interface: eth0\n"))
	for _, c := range []struct {
		yaml string
		want Impairment
	}{
		{"loss: 10%", Impairment{LossToVM: 1000}},
		{"loss: {toVM: 0.5%, fromVM: 100%}", Impairment{LossToVM: 50, LossFromVM: 10000}},
		{"loss: {fromVM: 0.25%}", Impairment{LossFromVM: 25}},
		{"loss: 0%", Impairment{}}, // (a way to say none, and keep the key)
		{"delay: 50ms", Impairment{DelayToVM: 50 * time.Millisecond}},
		{"delay: {toVM: 50ms, fromVM: 1.5ms}, jitter: {toVM: 5ms}", Impairment{DelayToVM: 50 * time.Millisecond, DelayFromVM: 1500 * time.Microsecond, JitterToVM: 5 * time.Millisecond}},
		{"duplicate: 1%, reorder: {fromVM: 25%}, delay: {fromVM: 10ms}", Impairment{DuplicateToVM: 100, ReorderFromVM: 2500, DelayFromVM: 10 * time.Millisecond}},
	} {
		vf, diags := LoadVMFile("v.yaml", []byte("vms:\n  a:\n    networks:\n      - vmnet: shared\n        impair: {"+c.yaml+"}\n"), VMFileOptions{})
		if err := diags.Err(); err != nil {
			t.Errorf("%s: %v", c.yaml, err)
			continue
		}
		if got := vf.VMs[0].Attachments[0].Impair; got == nil || *got != c.want {
			t.Errorf("%s: %+v, want %+v", c.yaml, got, c.want)
		}
	}
	if s := (&Impairment{LossToVM: 1000, LossFromVM: 25}).String(); s != "loss toVM 10%, fromVM 0.25%" {
		t.Errorf("String: %q", s)
	}
	if s := (&Impairment{DelayToVM: 50 * time.Millisecond, JitterToVM: 5 * time.Millisecond, DuplicateFromVM: 100, LossFromVM: 1}).String(); s != "loss fromVM 0.01%; delay toVM 50ms; jitter toVM 5ms; duplicate fromVM 1%" {
		t.Errorf("String: %q", s)
	}
	_, diags := LoadVMFile("v.yaml", []byte("vms:\n  a:\n    networks:\n      - vmnet: shared\n        attach: tap\n        impair: {delay: 1ms}\n"), VMFileOptions{})
	if err := diags.Err(); err == nil || !strings.Contains(err.Error(), "v.yaml:6: vms.a.networks[0].impair: delay, jitter, duplicate and reorder are done by the helper, which attach: tap leaves out of the path") {
		t.Errorf("attach: tap with a delay: %v", err)
	}
	for _, c := range []struct{ yaml, want string }{
		{"loss: 10", `v.yaml:5: vms.a.networks[0].impair.loss: "10" is not a loss`},
		{"loss: 100.5%", `"100.5%" is not a loss`},
		{"loss: 0.125%", `"0.125%" is not a loss`},
		{"loss: 5.%", `"5.%" is not a loss`},
		{"loss: {toVM: 1%, toVm: 2%}", `vms.a.networks[0].impair.loss.toVm: unknown field (did you mean "toVM"?)`},
		{"", "impairs nothing"},
		{"delay: 50", `v.yaml:5: vms.a.networks[0].impair.delay: "50" is not a delay: a duration from 0 to 1m0s`},
		{"delay: -1ms", `"-1ms" is not a delay`},
		{"delay: 2m", `"2m" is not a delay`},
		{"delay: {toVM: 5ms}, jitter: 10ms", `impair.jitter: toVM: a jitter of 10ms is more than the delay (5ms)`},
		{"reorder: {fromVM: 5%}", `impair.reorder: fromVM: reordering sends some frames at once, past delayed ones: it needs a delay`},
		{"duplicate: 101%", `impair.duplicate: "101%" is not a share`},
		{"delay: {toVm: 1ms}", `impair.delay.toVm: unknown field (did you mean "toVM"?)`},
		{"rate: 10Mbit", `impair.rate: is the entry's bandwidth, beside impair`},
		{"lose: 1%", `impair.lose: unknown field (did you mean "loss"?)`},
	} {
		_, diags := LoadVMFile("v.yaml", []byte("vms:\n  a:\n    networks:\n      - vmnet: shared\n        impair: {"+c.yaml+"}\n"), VMFileOptions{})
		if err := diags.Err(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("impair: %s: %v, want %q", c.yaml, err, c.want)
		}
	}
	vf, diags := LoadVMFile("v.yaml", []byte("vms:\n  a:\n    networks:\n      - vmnet: lan\n        impair: {loss: 1%}\n"), VMFileOptions{})
	if diags.Err() == nil {
		diags = Resolve(nets, []*VMFile{vf})
	}
	if err := diags.Err(); err == nil || !strings.Contains(err.Error(), "impairment is for shared and host networks") {
		t.Errorf("impair on a bridged network: %v", err)
	}
}
