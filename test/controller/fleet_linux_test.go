package controller_test

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
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

// pidsCgroup makes a pids cgroup (version 1's controller, or the unified
// hierarchy's) that allows max tasks, and returns its directory; it skips
// the test where there is none to make. The cgroup's processes are moved
// out, and it is removed, when the test ends.
func pidsCgroup(t *testing.T, max int) string {
	parent := "/sys/fs/cgroup/pids"
	if _, err := os.Stat(parent + "/cgroup.procs"); err != nil {
		parent = "/sys/fs/cgroup"
		if b, err := os.ReadFile(parent + "/cgroup.subtree_control"); err != nil || !strings.Contains(string(b), "pids") {
			t.Skip("no pids cgroup controller to limit tasks with")
		}
	}
	dir, err := os.MkdirTemp(parent, "vmnetctl-test-")
	if err != nil {
		t.Skipf("cannot make a pids cgroup: %v", err)
	}
	t.Cleanup(func() {
		for range 100 {
			b, _ := os.ReadFile(dir + "/cgroup.procs")
			for _, pid := range strings.Fields(string(b)) {
				os.WriteFile(parent+"/cgroup.procs", []byte(pid), 0o644)
			}
			if err := os.Remove(dir); err == nil || os.IsNotExist(err) {
				return
			}
			time.Sleep(10 * time.Millisecond) // (cleanup: a process that moved in as it forked)
		}
		t.Errorf("cgroup %s left behind", dir)
	})
	setPidsMax(t, dir, max)
	return dir
}

func setPidsMax(t *testing.T, dir string, max int) {
	if err := os.WriteFile(dir+"/pids.max", []byte(strconv.Itoa(max)), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestFleetAtTaskLimit: a controller whose cgroup allows few tasks starts
// the helpers there is room for and refuses the others, naming the limit,
// instead of starting threads until it cannot (a Go program that cannot
// start a thread dies: pthread_create failed); once the limit is raised,
// `up` again brings the rest up.
func TestFleetAtTaskLimit(t *testing.T) {
	const fleet = 40
	cg := pidsCgroup(t, 250)
	h := newHost(t)
	vms := h.WriteFile("fleet.yaml", fleetYAML(fleet, "shared"))
	// The CLI joins the cgroup before it runs, so that the controller it
	// starts, and every helper, are in it; it enters the namespace with
	// nsenter, not `ip netns exec`, whose /sys of the namespace's has no
	// cgroup to read the limit from.
	argv := append([]string{"nsenter", "--net=" + h.NS.Path(), "--"}, h.VmnetctlArgs("up", "-f", vms)...)
	cmd := exec.Command("sh", append([]string{"-c", `echo $$ > "$0" && exec "$@"`, cg + "/cgroup.procs"}, argv...)...)
	cmd.Env = append(os.Environ(), h.Env...)
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("up of %d VMs in a cgroup of 250 tasks succeeded: the test's limit is too loose\n%s", fleet, out)
	}
	if !strings.Contains(string(out), "no room for its process") || !strings.Contains(string(out), "pids.max 250") {
		t.Errorf("up at the task limit: the error does not name the limit:\n%s", out)
	}
	st := h.Status() // the controller answers: it did not die
	running := 0
	for _, a := range st.Attachments {
		if a.State == ctlapi.StateRunning {
			running++
		}
	}
	if running == 0 || running == fleet {
		t.Errorf("%d of %d attachments running in a cgroup of 250 tasks, want some and not all", running, fleet)
	}
	t.Logf("%d of %d attachments running in a cgroup of 250 tasks", running, fleet)
	setPidsMax(t, cg, 4000)
	if out, err := h.Vmnetctl("up", "-f", vms); err != nil {
		t.Fatalf("up once the limit was raised: %v\n%s", err, out)
	}
	running = 0
	for _, a := range h.Status().Attachments {
		if a.State == ctlapi.StateRunning {
			running++
		}
	}
	if running != fleet {
		t.Errorf("%d of %d attachments running once the limit was raised", running, fleet)
	}
}
