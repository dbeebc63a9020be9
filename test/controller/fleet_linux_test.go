package controller_test

import (
	"fmt"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/ctlapi"
)

// cpuHog keeps every CPU busy with two busy loops each, in processes of
// their own, until the test ends: the machine a fleet's `up` must not fail
// on (issue 30).
func cpuHog(t *testing.T) {
	for range 2 * runtime.NumCPU() {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	}
}

// fleetYAML is a VM file of n VMs on network.
func fleetYAML(n int, network string) string {
	var b strings.Builder
	b.WriteString("vms:\n")
	for i := range n {
		fmt.Fprintf(&b, "  f%03d:\n    networks: [{vmnet: %s}]\n", i, network)
	}
	return b.String()
}

// TestFleetUnderLoad: up of 300 VMs on a machine whose CPUs are all busy
// with other work succeeds, every attachment running, and down removes
// them. Before issue 30's changes it failed here ("helper not ready after
// 15s"): the helpers all started at once, each failed at a fixed deadline
// while it was still getting somewhere.
func TestFleetUnderLoad(t *testing.T) {
	const fleet = 300
	h := newHost(t)
	vms := h.WriteFile("fleet.yaml", fleetYAML(fleet, "shared"))
	cpuHog(t)
	began := time.Now()
	out, err := h.Vmnetctl("up", "-f", vms)
	if err != nil {
		t.Fatalf("up of %d VMs under a CPU hog: %v\n%s", fleet, err, out)
	}
	t.Logf("up of %d VMs under a CPU hog: %v", fleet, time.Since(began).Round(time.Millisecond))
	st := h.Status()
	running := 0
	for _, a := range st.Attachments {
		if a.State == ctlapi.StateRunning {
			running++
		}
	}
	if running != fleet {
		t.Errorf("%d of %d attachments running after up", running, fleet)
	}
	if out, err := h.Vmnetctl("down", "-f", vms); err != nil {
		t.Fatalf("down: %v\n%s", err, out)
	}
}
