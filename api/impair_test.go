package api

import (
	"strings"
	"testing"
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
	for _, c := range []struct{ yaml, want string }{
		{"loss: 10", `v.yaml:5: vms.a.networks[0].impair.loss: "10" is not a loss`},
		{"loss: 100.5%", `"100.5%" is not a loss`},
		{"loss: 0.125%", `"0.125%" is not a loss`},
		{"loss: 5.%", `"5.%" is not a loss`},
		{"loss: {toVM: 1%, toVm: 2%}", `vms.a.networks[0].impair.loss.toVm: unknown field (did you mean "toVM"?)`},
		{"", "impairs nothing"},
		{"delay: 50ms", `impair.delay: is not impaired by vmnetctl, which loses frames alone`},
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
