package shaper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// lab is a port p in namespace host whose other end is eth0 at 10.99.0.2
// in namespace vm (the VM), p at 10.99.0.1.
func lab(t *testing.T, label string) (host, vm *testutil.NS) {
	t.Helper()
	testutil.RequireRoot(t, "changes qdiscs in network namespaces")
	host, vm = testutil.NewNS(t, label+"-host"), testutil.NewNS(t, label+"-vm")
	testutil.Run(t, "ip", "-n", host.Name, "link", "add", "p", "type", "veth", "peer", "name", "eth0", "netns", vm.Name)
	host.MustRun(t, "ip", "addr", "add", "10.99.0.1/24", "dev", "p")
	host.MustRun(t, "ip", "link", "set", "p", "up")
	vm.MustRun(t, "ip", "addr", "add", "10.99.0.2/24", "dev", "eth0")
	vm.MustRun(t, "ip", "link", "set", "eth0", "up")
	return host, vm
}

// TestSet: Set puts the limits on the port (a token bucket to the VM, a
// redirect to a marked IFB device shaped from it), as Get reads them
// back and tc shows them; setting them again changes nothing; a change
// replaces them; nil removes both, the IFB device too.
func TestSet(t *testing.T) {
	host, vm := lab(t, "sh")
	set := func(b *api.Bandwidth) *api.Bandwidth {
		t.Helper()
		var got *api.Bandwidth
		host.MustDo(t, func() (err error) {
			if err := Set("p", b); err != nil {
				return err
			}
			got, err = Get("p")
			return err
		})
		return got
	}
	// The kernel keeps a burst as the time it takes at the rate: read
	// back, it is within a few bytes.
	same := func(got *api.Bandwidth, want api.Bandwidth) bool {
		return got != nil && got.ToVM == want.ToVM && got.FromVM == want.FromVM &&
			got.Burst <= want.Burst && got.Burst >= want.Burst-want.Burst/1000
	}
	b := &api.Bandwidth{ToVM: 20_000_000, FromVM: 10_000_000}
	want := api.Bandwidth{ToVM: 20_000_000, FromVM: 10_000_000, Burst: b.BurstFor(20_000_000)}
	if got := set(b); !same(got, want) {
		t.Fatalf("after Set: %+v, want %+v", got, want)
	}
	qdiscs := host.MustRun(t, "tc", "qdisc", "show", "dev", "p")
	if !strings.Contains(qdiscs, "tbf 1: root") || !strings.Contains(qdiscs, "ingress ffff:") {
		t.Errorf("tc shows:\n%s", qdiscs)
	}
	ifb := api.ShaperName("p")
	if filters := host.MustRun(t, "tc", "filter", "show", "dev", "p", "ingress"); !strings.Contains(filters, "u32") || !strings.Contains(filters, "Redirect to device "+ifb) {
		t.Errorf("the ingress filters:\n%s", filters)
	}
	if link := host.MustRun(t, "ip", "-d", "link", "show", ifb); !strings.Contains(link, "alias vmnetctl:shaper=p") || !strings.Contains(link, "ifb") {
		t.Errorf("the IFB device:\n%s", link)
	}
	if got := set(b); !same(got, want) {
		t.Errorf("after Set again: %+v", got)
	}
	if filters := host.MustRun(t, "tc", "filter", "show", "dev", "p", "ingress"); strings.Count(filters, "Redirect") != 1 {
		t.Errorf("two Sets left these filters:\n%s", filters)
	}
	// The IFB device deleted behind vmnetctl's back: Set makes it again,
	// and the redirect to the one gone goes, or the kernel would drop
	// every frame from the VM.
	host.MustRun(t, "ip", "link", "del", ifb)
	if got := set(b); !same(got, want) {
		t.Errorf("after the IFB device was deleted, Set again: %+v", got)
	}
	if filters := host.MustRun(t, "tc", "filter", "show", "dev", "p", "ingress"); strings.Count(filters, "Redirect") != 1 {
		t.Errorf("after the IFB device was made again, the redirects:\n%s", filters)
	}
	if err := vm.Ping("10.99.0.1", 1); err != nil {
		t.Errorf("the VM's frames after the IFB device was made again: %v", err)
	}
	b2 := &api.Bandwidth{ToVM: 5_000_000, Burst: 256 << 10}
	if got := set(b2); !same(got, *b2) {
		t.Errorf("after a change: %+v, want %+v", got, b2)
	}
	if got := set(nil); got != nil {
		t.Errorf("after Set(nil): %+v", got)
	}
	if qdiscs := host.MustRun(t, "tc", "qdisc", "show", "dev", "p"); strings.Contains(qdiscs, "tbf") || strings.Contains(qdiscs, "ingress") {
		t.Errorf("after Set(nil), tc shows:\n%s", qdiscs)
	}
	if out, err := host.Run(context.Background(), "ip", "link", "show", ifb); err == nil {
		t.Errorf("after Set(nil), the IFB device is left:\n%s", out)
	}
}

// TestLimitsHold: TCP through a limited port, one stream or eight, never
// goes much past its limit in either direction (an upper bound: a busy machine only makes
// it slower), with the port's segmentation offloads on (its 64 KiB
// frames pass the policer and the bucket).
func TestLimitsHold(t *testing.T) {
	host, vm := lab(t, "sl")
	testutil.RequireCommands(t, "iperf3")
	host.MustDo(t, func() error { return Set("p", &api.Bandwidth{ToVM: 20_000_000, FromVM: 10_000_000}) })
	vm.Start(t, filepath.Join(t.TempDir(), "iperf3.log"), "iperf3", "-s", "-B", "10.99.0.2")
	rate := func(args ...string) float64 {
		t.Helper()
		var bps float64
		// Until a run moves data: on a busy machine a run may start before
		// the server listens, or move nothing in its seconds.
		testutil.Eventually(t, 60*time.Second, func() error {
			out, err := host.Run(context.Background(), "iperf3", append([]string{"-c", "10.99.0.2", "-t", "3", "-J"}, args...)...)
			var r struct {
				Error string `json:"error"`
				End   struct {
					SumReceived struct {
						BitsPerSecond float64 `json:"bits_per_second"`
					} `json:"sum_received"`
				} `json:"end"`
			}
			if jerr := json.Unmarshal([]byte(out), &r); err != nil || jerr != nil || r.Error != "" {
				return fmt.Errorf("iperf3: %v %v %s", err, jerr, r.Error)
			}
			if bps = r.End.SumReceived.BitsPerSecond; bps <= 0 {
				return errors.New("iperf3 moved nothing")
			}
			return nil
		}, "iperf3 %v through the port", args)
		return bps
	}
	to, from := rate(), rate("-R")
	to8, from8 := rate("-P", "8"), rate("-R", "-P", "8")
	t.Logf("TCP through the limits: %.1f Mbit/s to the VM (20), %.1f from it (10); eight streams: %.1f and %.1f", to/1e6, from/1e6, to8/1e6, from8/1e6)
	if to8 > 22e6 || from8 > 11e6 {
		t.Errorf("eight streams: %.1f Mbit/s to the VM (limit 20), %.1f from it (limit 10)", to8/1e6, from8/1e6)
	}
	if to > 22e6 {
		t.Errorf("to the VM, limited to 20 Mbit/s: %.1f Mbit/s", to/1e6)
	}
	if from > 11e6 {
		t.Errorf("from the VM, limited to 10 Mbit/s: %.1f Mbit/s", from/1e6)
	}
}
