package api

import (
	"strings"
	"testing"
)

// TestBandwidth: an entry's bandwidth reads rates in tc's units (any
// case) and a burst in bytes; a rate or burst out of bounds, without a
// unit, or a limit of nothing is refused at its line and field.
func TestBandwidth(t *testing.T) {
	entry := func(bw string) string {
		return "vms:\n  a:\n    networks:\n      - vmnet: shared\n        bandwidth: " + bw + "\n"
	}
	for _, tc := range []struct {
		bw   string
		want Bandwidth
	}{
		{"{toVM: 100Mbit}", Bandwidth{ToVM: 100_000_000}},
		{"{fromVM: 1gbit, toVM: 600 kbit}", Bandwidth{ToVM: 600_000, FromVM: 1_000_000_000}},
		{"{toVM: 20Mbit, fromVM: 10Mbit, burst: 256KiB}", Bandwidth{ToVM: 20_000_000, FromVM: 10_000_000, Burst: 256 << 10}},
		{"{toVM: 8Mbit, burst: 1MB}", Bandwidth{ToVM: 8_000_000, Burst: 1_000_000}},
	} {
		vf, diags := LoadVMFile("v.yaml", []byte(entry(tc.bw)), VMFileOptions{})
		if err := diags.Err(); err != nil {
			t.Errorf("%s: %v", tc.bw, err)
			continue
		}
		if got := vf.VMs[0].Attachments[0].Bandwidth; got == nil || *got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.bw, got, tc.want)
		}
	}
	for _, tc := range []struct{ bw, want string }{
		{"{toVM: 100}", `v.yaml:5: vms.a.networks[0].bandwidth.toVM: "100" is not a rate in bits per second like 100Mbit, 1Gbit or 500kbit`},
		{"{toVM: 100Mbps}", `"100Mbps" is not a rate`},
		{"{fromVM: 1bit}", "bandwidth.fromVM: 1bit is outside 512kbit-32Gbit"},
		{"{toVM: 1Tbit}", "bandwidth.toVM: 1Tbit is outside 512kbit-32Gbit"},
		{"{toVM: 1Mbit, burst: 64KiB}", "bandwidth.burst: 64KiB is outside 128KiB-256MiB"},
		{"{toVM: 1Mbit, burst: lots}", `bandwidth.burst: "lots" is not a size in bytes like 256KiB or 1MB`},
		{"{burst: 1MiB}", "bandwidth: limits nothing: give toVM, fromVM or both"},
		{"{toVm: 1Mbit}", `unknown field`},
		{"{toVM: 1Mbit, burst: 1MiB}", "bandwidth.burst: 1MiB is more than 4 s at 1Mbit"},
		{"100Mbit", "bandwidth: must be a mapping"},
	} {
		_, diags := LoadVMFile("v.yaml", []byte(entry(tc.bw)), VMFileOptions{})
		if err := diags.Err(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.bw, err, tc.want)
		}
	}
}

// TestBandwidthString: a limit is written back in the largest unit that
// divides it, as a VM file would give it.
func TestBandwidthString(t *testing.T) {
	for _, tc := range []struct {
		b    *Bandwidth
		want string
	}{
		{nil, ""},
		{&Bandwidth{ToVM: 100_000_000}, "toVM 100Mbit"},
		{&Bandwidth{ToVM: 1_500_000, FromVM: 1_000_000_000, Burst: 256 << 10}, "toVM 1500kbit, fromVM 1Gbit, burst 256KiB"},
		{&Bandwidth{FromVM: 8001}, "fromVM 8001bit"},
	} {
		if got := tc.b.String(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.b, got, tc.want)
		}
	}
	if got := (&Bandwidth{ToVM: 1_000_000_000}).BurstFor(1_000_000_000); got != 1_250_000 {
		t.Errorf("the default burst at 1Gbit: %d, want 10 ms of it (1250000)", got)
	}
	if got := (&Bandwidth{ToVM: MinRate}).BurstFor(MinRate); got != MinBurst || got*8 > MinRate*maxBurstTime {
		t.Errorf("the default burst at MinRate: %d, want MinBurst, within %d s of the rate", got, maxBurstTime)
	}
}
