package controller_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"

	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/test/simvm"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// pingLoss pings the gateway n times from vm, 2 ms apart, and returns
// the share of echoes that got no reply, in percent.
func pingLoss(t *testing.T, vm *simvm.VM, n int) float64 {
	t.Helper()
	out, _ := vm.Run(context.Background(), "ping", "-q", "-n", "-c", fmt.Sprint(n), "-i", "0.002", "-W", "5", gateway)
	var sent, got int
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "packets transmitted") {
			fmt.Sscanf(line, "%d packets transmitted, %d received", &sent, &got)
		}
	}
	if sent != n {
		t.Fatalf("ping sent %d of %d:\n%s", sent, n, out)
	}
	return 100 * float64(sent-got) / float64(sent)
}

// impairedVM writes the VM file of one VM on shared, whose entry has
// impair (none if ""), and returns its path.
func impairedVM(h *host, vm string) func(impair string) string {
	return func(impair string) string {
		s := "vms:\n  " + vm + ":\n    networks:\n      - vmnet: shared\n"
		if impair != "" {
			s += "        impair: " + impair + "\n"
		}
		return h.WriteFile("vms.yaml", s)
	}
}

// TestImpairLoss: an attachment's `impair: {loss: 10%}` loses about a
// tenth of the frames to the VM (1,000 pings: 5 to 15% lost; 10 ± 2 in
// all but a few runs in a hundred); a change by `up` applies in place
// (the helper the same), 100% from the VM cuts it off; removed, nothing
// is lost and the impairment's chains are gone.
func TestImpairLoss(t *testing.T) {
	h := newHost(t)
	vms := impairedVM(h, "lossy")
	h.MustVmnetctl("up", "-f", vms("{loss: 10%}"))
	a := h.Attachment(h.Status(), "lossy")
	if a.Impair == nil || a.Impair.LossToVM != 1000 {
		t.Errorf("status: impair %+v", a.Impair)
	}
	vm := h.VM(a)
	vm.DHCP(t)
	loss := pingLoss(t, vm, 1000)
	t.Logf("1,000 pings through a 10%% loss to the VM: %.1f%% lost", loss)
	if loss < 5 || loss > 15 {
		t.Errorf("1,000 pings through a 10%% loss: %.1f%% lost", loss)
	}
	h.MustVmnetctl("up", "-f", vms("{loss: {fromVM: 100%}}"))
	if b := h.Attachment(h.Status(), "lossy"); b.PID != a.PID {
		t.Errorf("changing the impairment restarted the helper: pid %d, then %d", a.PID, b.PID)
	}
	if loss := pingLoss(t, vm, 20); loss != 100 {
		t.Errorf("20 pings through a 100%% loss from the VM: %.0f%% lost", loss)
	}
	h.MustVmnetctl("up", "-f", vms(""))
	if loss := pingLoss(t, vm, 100); loss != 0 {
		t.Errorf("100 pings with no impairment: %.0f%% lost", loss)
	}
	for _, chain := range []string{"impair-from", "impair-to"} {
		if out, err := h.Run(context.Background(), "nft", "list", "chain", "bridge", hostnet.TableName("shared"), chain); err == nil {
			t.Errorf("with no impairment left, the chain %s stays:\n%s", chain, out)
		}
	}
}

// pings pings the gateway n times from vm, interval apart, and returns
// each reply's round trip and how many were duplicates.
func pings(t *testing.T, vm *simvm.VM, n int, interval time.Duration) (rtts []time.Duration, dups int) {
	t.Helper()
	out, _ := vm.Run(context.Background(), "ping", "-n", "-c", fmt.Sprint(n), "-i", fmt.Sprintf("%.3f", interval.Seconds()), "-W", "5", gateway)
	for _, line := range strings.Split(out, "\n") {
		if _, after, ok := strings.Cut(line, " time="); ok && !strings.Contains(line, "(DUP!)") {
			var ms float64
			if _, err := fmt.Sscanf(after, "%f ms", &ms); err == nil {
				rtts = append(rtts, time.Duration(ms*float64(time.Millisecond)))
			}
		}
		if strings.Contains(line, "(DUP!)") {
			dups++
		}
	}
	if len(rtts) == 0 {
		t.Fatalf("no replies to %d pings:\n%s", n, out)
	}
	return rtts, dups
}

// TestImpairShaped: an attachment's `impair: {delay: 50ms}` makes its
// pings 50 ms slower: the least round trip of 20 is 50 ms or more, and
// at most 55 ms over the least without it, applied in place by `up` (the helper
// the same); duplicate: 100% doubles every reply; reorder: 50% with a
// 100 ms delay sends about half at once; `vmnetctl impair --delay
// --jitter` applies at once; with none left the round trips are back.
func TestImpairShaped(t *testing.T) {
	h := newHost(t)
	vms := impairedVM(h, "shaped")
	h.MustVmnetctl("up", "-f", vms(""))
	a := h.Attachment(h.Status(), "shaped")
	vm := h.VM(a)
	vm.DHCP(t)
	base := slices.Min(first(pings(t, vm, 20, 20*time.Millisecond)))
	h.MustVmnetctl("up", "-f", vms("{delay: 50ms}"))
	if b := h.Attachment(h.Status(), "shaped"); b.PID != a.PID || b.Impair == nil || b.Impair.String() != "delay toVM 50ms" {
		t.Fatalf("after up with a delay: pid %d (was %d), impair %v", b.PID, a.PID, b.Impair)
	}
	least := slices.Min(first(pings(t, vm, 20, 20*time.Millisecond)))
	t.Logf("least round trip of 20 pings: %v without a delay, %v with 50 ms", base, least)
	// A round trip through the delay line takes at least the delay; what
	// it adds to the least round trip without it may come out a little
	// under 50 ms when that least was itself a slow one.
	if added := least - base; least < 50*time.Millisecond || added > 55*time.Millisecond {
		t.Errorf("a 50 ms delay added %v to the least round trip (%v)", added, least)
	}
	h.MustVmnetctl("up", "-f", vms("{delay: {fromVM: 20ms}, duplicate: 100%}"))
	rtts, dups := pings(t, vm, 10, 50*time.Millisecond)
	// (ping may end before the last reply's copy comes)
	if len(rtts) != 10 || dups < 9 || slices.Min(rtts) < 20*time.Millisecond {
		t.Errorf("20 ms from the VM and every frame to it twice: %d replies, %d duplicates, least %v", len(rtts), dups, slices.Min(rtts))
	}
	h.MustVmnetctl("up", "-f", vms("{delay: 100ms, reorder: 50%}"))
	rtts, _ = pings(t, vm, 40, 10*time.Millisecond)
	fast := 0
	for _, rtt := range rtts {
		if rtt < 100*time.Millisecond {
			fast++
		}
	}
	if len(rtts) != 40 || fast < 8 || fast > 32 {
		t.Errorf("a 100 ms delay, half reordered: %d of %d replies under 100 ms", fast, len(rtts))
	}
	out := h.MustVmnetctl("impair", "shaped", "--delay", "30ms", "--jitter", "10ms")
	if !strings.Contains(out, "impair delay toVM 30ms; jitter toVM 10ms (set by vmnetctl impair") {
		t.Errorf("impair --delay --jitter said %q", out)
	}
	rtts, _ = pings(t, vm, 20, 20*time.Millisecond)
	if least, most := slices.Min(rtts), slices.Max(rtts); least < 20*time.Millisecond || most-least < 2*time.Millisecond {
		t.Errorf("30 ms ± 10 ms: round trips from %v to %v", least, most)
	}
	h.MustVmnetctl("impair", "shaped", "--clear")
	h.MustVmnetctl("up", "-f", vms(""))
	if least := slices.Min(first(pings(t, vm, 10, 20*time.Millisecond))); least >= 20*time.Millisecond {
		t.Errorf("with no impairment left, the least round trip is %v", least)
	}
	if b := h.Attachment(h.Status(), "shaped"); b.PID != a.PID {
		t.Errorf("the shaping changes restarted the helper: pid %d, then %d", a.PID, b.PID)
	}
	// Shaped again, then down: the helper and its shaping file go.
	h.MustVmnetctl("up", "-f", vms("{delay: 5ms}"))
	shaping := filepath.Join(h.StateDir(), "helpers", "shaped.0.shaping")
	if b, err := os.ReadFile(shaping); err != nil || !strings.Contains(string(b), `"delay":5000000`) {
		t.Errorf("the shaping file: %q, %v", b, err)
	}
	h.MustVmnetctl("down", "-f", vms("{delay: 5ms}"))
	if _, err := os.Stat(shaping); !os.IsNotExist(err) {
		t.Errorf("after down the shaping file is still there: %v", err)
	}
}

// TestImpairShapedVhostUser: a vhost-user attachment's link is shaped by
// its helper too (the backend's delay lines): 50 ms more to the VM, and
// each of its echo requests sent twice, so each gets two replies.
func TestImpairShapedVhostUser(t *testing.T) {
	h := newHost(t)
	h.MustVmnetctl("up", "-f", h.WriteFile("vms.yaml", "vms:\n  vs:\n    networks:\n      - vmnet: shared\n        attach: vhost-user\n        macAddress: \"52:55:55:e7:00:09\"\n"+
		"        impair: {delay: 50ms, duplicate: {fromVM: 100%}}\n"))
	vm := h.VM(h.Attachment(h.Status(), "vs"))
	vm.DHCP(t)
	rtts, dups := pings(t, vm, 10, 50*time.Millisecond)
	if least := slices.Min(rtts); least < 50*time.Millisecond || len(rtts) != 10 || dups < 9 {
		t.Errorf("50 ms to the VM, its frames twice: %d replies, %d duplicates, least round trip %v", len(rtts), dups, least)
	}
}

// first is the first of two results.
func first[T, U any](t T, _ U) T { return t }

// TestImpairCommand: `vmnetctl impair` changes a running VM's loss now,
// in place of its VM file's, and says so; a later `up` keeps it and says
// how it differs from the file; --clear gives the file's back; a VM that
// is not up, or a bad loss, is refused with why.
func TestImpairCommand(t *testing.T) {
	h := newHost(t)
	vms := h.WriteFile("vms.yaml", "vms:\n  web:\n    networks:\n      - vmnet: shared\n        impair: {loss: 1%}\n")
	h.MustVmnetctl("up", "-f", vms)
	a := h.Attachment(h.Status(), "web")
	vm := h.VM(a)
	vm.DHCP(t)
	out := h.MustVmnetctl("impair", "web", "--loss-from", "100%")
	if want := "web/0 on shared: impair loss fromVM 100% (set by vmnetctl impair; the VM file's: loss toVM 1%)"; strings.TrimSpace(out) != want {
		t.Errorf("impair said %q, want %q", out, want)
	}
	if loss := pingLoss(t, vm, 20); loss != 100 {
		t.Errorf("after impair --loss-from 100%%: %.0f%% of 20 pings lost", loss)
	}
	// A later up keeps it, and says how it differs from the file.
	if out := h.MustVmnetctl("up", "-f", vms); !strings.Contains(out, "impair loss fromVM 100% (set by vmnetctl impair; the VM file's: loss toVM 1%)") {
		t.Errorf("up after impair says:\n%s", out)
	}
	if b := h.Attachment(h.Status(), "web"); b.PID != a.PID || b.ImpairSetBy != "vmnetctl impair" {
		t.Errorf("after up: pid %d (was %d), impair set by %q", b.PID, a.PID, b.ImpairSetBy)
	}
	if loss := pingLoss(t, vm, 20); loss != 100 {
		t.Errorf("after up, the impair kept: %.0f%% of 20 pings lost", loss)
	}
	if out := h.MustVmnetctl("impair", "web", "--none"); !strings.Contains(out, "no impairment (set by vmnetctl impair") {
		t.Errorf("impair --none said %q", out)
	}
	if loss := pingLoss(t, vm, 50); loss != 0 {
		t.Errorf("after impair --none: %.0f%% of 50 pings lost", loss)
	}
	if out := h.MustVmnetctl("impair", "web", "--clear"); strings.TrimSpace(out) != "web/0 on shared: impair loss toVM 1%" {
		t.Errorf("impair --clear said %q", out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"impair", "nosuch", "--loss", "5%"}, `impair: VM "nosuch" is not up`},
		{[]string{"impair", "web", "--loss", "5"}, `--loss "5" is not a loss`},
		{[]string{"impair", "web"}, "say what the link does"},
		{[]string{"impair", "web", "--jitter", "5ms"}, "toVM: a jitter of 5ms is more than its delay (0s)"},
		{[]string{"impair", "web", "--delay", "50"}, `--delay "50" is not a delay`},
		{[]string{"impair", "web", "--none", "--loss", "1%"}, "--none and --clear go alone"},
	} {
		if _, err := h.Vmnetctl(c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
}

// TestFlightRecorder: `capture --ring` keeps the last frames of a VM's
// port and writes them when its helper exits (killed here), saying why,
// as pcapng gopacket reads: the pings before the crash are there; when
// it is interrupted (Ctrl-C); and when the guard drops a burst of the
// VM's frames (it sends from a MAC not its own), with those frames in it.
func TestFlightRecorder(t *testing.T) {
	h := newHost(t)
	h.MustVmnetctl("up", "-f", h.WriteFile("vms.yaml", "vms:\n  fr:\n    networks: [{vmnet: shared}]\n"))
	a := h.Attachment(h.Status(), "fr")
	vm := h.VM(a)
	vm.DHCP(t)
	// record runs a flight recorder while act runs, and returns what it
	// said and the echo requests from the VM it wrote.
	var recording *exec.Cmd // the capture record runs
	record := func(act func()) (said string, requests int) {
		t.Helper()
		file := filepath.Join(t.TempDir(), "fr.pcapng")
		cmd := h.VmnetctlCommand(context.Background(), "capture", "fr", "--ring", "64KiB", "-w", file)
		recording = cmd
		var errOut testutil.Buffer
		cmd.Stderr = &errOut
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		t.Cleanup(func() { cmd.Process.Kill() })
		testutil.Eventually(t, 30*time.Second, func() error {
			if !strings.Contains(errOut.String(), "recording the last 64KiB") {
				return fmt.Errorf("capture said %q", errOut.String())
			}
			return nil
		}, "the flight recorder to start")
		act()
		// A deadline for the test, not for the product: a recorder
		// that never ends is the failure this waits for.
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("capture: %v\n%s", err, errOut.String())
			}
		case <-time.After(3 * time.Minute):
			t.Fatalf("the flight recorder did not end; it said %q; the VM's spoofed frames dropped: %d",
				errOut.String(), h.Attachment(h.Status(), "fr").SpoofDrops)
		}
		f, err := os.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		r, err := pcapgo.NewNgReader(f, pcapgo.DefaultNgReaderOptions)
		if err != nil {
			t.Fatal(err)
		}
		for {
			data, ci, err := r.ReadPacketData()
			if err != nil {
				break
			}
			if icmp, ok := gopacket.NewPacket(data, layers.LayerTypeEthernet, gopacket.Default).Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4); ok && icmp.TypeCode.Type() == layers.ICMPv4TypeEchoRequest && ci.InterfaceIndex == 0 {
				requests++
			}
		}
		return errOut.String(), requests
	}
	said, requests := record(func() {
		if err := vm.Ping(gateway, 3); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(a.PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	})
	if !strings.Contains(said, `ended="the port went: its helper exited"`) || requests < 3 {
		t.Errorf("after the helper was killed, capture said %q and wrote %d echo requests, want the 3 before it", said, requests)
	}
	// The helper back (the same socket; the VM follows it).
	testutil.Eventually(t, 60*time.Second, func() error {
		if b := h.Attachment(h.Status(), "fr"); b.PID == a.PID || b.State != ctlapi.StateRunning {
			return fmt.Errorf("helper pid %d, %s", b.PID, b.State)
		}
		return vm.Ping(gateway, 1)
	}, "the helper back")
	// Interrupted (Ctrl-C), the recorder writes what it holds.
	said, requests = record(func() {
		if err := vm.Ping(gateway, 3); err != nil {
			t.Fatal(err)
		}
		if err := recording.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
	})
	if !strings.Contains(said, `ended="interrupted"`) || requests < 3 {
		t.Errorf("interrupted, capture said %q and wrote %d echo requests, want the 3 before", said, requests)
	}
	// The VM sends from a MAC not its own: the guard drops a burst,
	// which ends the recorder, with them in it.
	said, requests = record(func() {
		// A new MAC flushes the VM's neighbours, and its ARP requests
		// would be dropped too: the gateway's entry is put back, fixed.
		gw := strings.Fields(vm.MustRun(t, "ip", "neigh", "show", gateway, "dev", "eth0"))
		if len(gw) < 3 || gw[1] != "lladdr" {
			t.Fatalf("the VM's neighbour entry of the gateway: %q", gw)
		}
		vm.MustRun(t, "ip", "link", "set", "eth0", "address", "02:00:00:00:0f:0f")
		vm.MustRun(t, "ip", "neigh", "replace", gateway, "lladdr", gw[2], "dev", "eth0", "nud", "permanent")
		vm.Run(context.Background(), "ping", "-q", "-c", "100", "-i", "0.005", "-W", "1", gateway)
	})
	if !strings.Contains(said, `ended="the guard dropped`) || requests < 20 {
		t.Errorf("after a burst of spoofed frames, capture said %q and wrote %d echo requests", said, requests)
	}
}

// TestShapingFileDrift: a shaping file written behind the controller's
// back is put back by the next full pass: an unshaped helper's emptied,
// a shaped one's given its shaping again. (An unshaped helper's file is
// read only when the watch of the helpers' directory saw it written
// since the last full pass found it right: this is the write it sees.)
func TestShapingFileDrift(t *testing.T) {
	h := newHost(t)
	h.Env = append(h.Env, "VMNETCTL_RESYNC=1s")
	vms := h.WriteFile("vms.yaml", "vms:\n  plain:\n    networks:\n      - vmnet: shared\n  shaped:\n    networks:\n      - vmnet: shared\n        impair: {delay: 5ms}\n")
	h.MustVmnetctl("up", "-f", vms)
	helpers := filepath.Join(h.StateDir(), "helpers")
	wrong := []byte(`{"toVM":{"delay":500000000}}`)
	for _, c := range []struct{ file, want string }{
		{"plain.0.shaping", `"toVM":{}`},
		{"shaped.0.shaping", `"delay":5000000`},
	} {
		path := filepath.Join(helpers, c.file)
		// Two passes more (full ones: the resync's, every second): one
		// has found the file right since, and written nothing.
		passes, err := h.series("vmnetctl_reconciles_total", `result="success"`)
		if err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 30*time.Second, func() error {
			if n, err := h.series("vmnetctl_reconciles_total", `result="success"`); err != nil || n < passes+2 {
				return fmt.Errorf("%v passes since, %v", n-passes, err)
			}
			return nil
		}, "two passes after up")
		if err := os.WriteFile(path, wrong, 0o640); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 30*time.Second, func() error {
			b, err := os.ReadFile(path)
			if err != nil || bytes.Contains(b, []byte("500000000")) || c.want == `"delay":5000000` && !bytes.Contains(b, []byte(c.want)) {
				return fmt.Errorf("%s: %q, %v", c.file, b, err)
			}
			return nil
		}, "%s to be put back", c.file)
	}
}
