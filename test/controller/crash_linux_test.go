package controller_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/procid"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestKillControllerWhileHelpersStart kills the controller with SIGKILL at
// a random instant while it starts the helpers of many attachments, over
// several rounds, and checks the process table, not the state files: after
// the next `up` there is exactly one helper per attachment, and after
// `down --all` none.
func TestKillControllerWhileHelpersStart(t *testing.T) {
	h := newHost(t)
	const n = 12
	var vms strings.Builder
	vms.WriteString("vms:\n")
	for i := range n {
		fmt.Fprintf(&vms, "  c%02d:\n    networks: [{vmnet: shared}]\n", i)
	}
	file := h.WriteFile("crash.yaml", vms.String())
	helpers := func() []procid.Identity {
		ps, err := procid.Processes(func(cmdline []string) bool {
			return len(cmdline) > 1 && cmdline[1] == "helper" && slices.ContainsFunc(cmdline, func(a string) bool {
				return strings.HasPrefix(a, h.StateDir()+"/")
			})
		})
		if err != nil {
			t.Fatal(err)
		}
		return ps
	}
	controllers := func() []procid.Identity {
		ps, _ := procid.Processes(func(cmdline []string) bool {
			return slices.Contains(cmdline, "serve") && slices.Contains(cmdline, h.StateDir())
		})
		return ps
	}
	for round := range 4 {
		ctx, cancel := context.WithCancel(context.Background())
		up := h.VmnetctlCommand(ctx, "up", "-f", file, "--metrics-addr", "off")
		if err := up.Start(); err != nil {
			t.Fatal(err)
		}
		// Kill once some of the helpers, not all, have started.
		k := 1 + rand.IntN(n-1)
		testutil.Eventually(t, 60*time.Second, func() bool { return len(helpers()) >= k },
			"round %d: %d helpers starting", round, k)
		for _, c := range controllers() {
			syscall.Kill(c.PID, syscall.SIGKILL)
		}
		cancel()
		up.Wait()
		t.Logf("round %d: killed the controller with %d helpers running", round, len(helpers()))
		if round%2 == 1 {
			// A restart killed too: the next up's fresh controller,
			// while it adopts the recorded helpers and stops the
			// others (or soon after).
			restart := h.VmnetctlCommand(context.Background(), "up", "-f", file, "--metrics-addr", "off")
			if err := restart.Start(); err != nil {
				t.Fatal(err)
			}
			testutil.Eventually(t, 30*time.Second, func() bool { return len(controllers()) > 0 },
				"round %d: the restarted controller", round)
			time.Sleep(time.Duration(rand.IntN(300)) * time.Millisecond) // the fault's instant, not a wait for a condition
			for _, c := range controllers() {
				syscall.Kill(c.PID, syscall.SIGKILL)
			}
			restart.Process.Kill()
			restart.Wait()
			t.Logf("round %d: killed the restarted controller with %d helpers running", round, len(helpers()))
		}

		h.MustVmnetctl("up", "-f", file, "--metrics-addr", "off")
		testutil.Eventually(t, 30*time.Second, func() error {
			if got := len(helpers()); got != n {
				return fmt.Errorf("%d helper processes for %d attachments", got, n)
			}
			return nil
		}, "round %d: one helper per attachment after up", round)
		if round%2 == 1 {
			continue // the next round's up starts from a running controller
		}
		h.MustVmnetctl("down", "--all")
		if ps := helpers(); len(ps) != 0 {
			t.Fatalf("round %d: %d helpers run after down --all: %v", round, len(ps), ps)
		}
		nothingLeft(t, h, fmt.Sprintf("round %d: after down --all", round))
	}
	h.MustVmnetctl("down", "--all")
	if ps := helpers(); len(ps) != 0 {
		t.Fatalf("%d helpers run after down --all", len(ps))
	}
	nothingLeft(t, h, "after the last down --all")
}

// nothingLeft fails the test if, by the test's own rules (stateDirProcs,
// leftLinks), a process names h's state dir, a cleanup child runs or a
// bridge or TAP of vmnetctl's names is left.
func nothingLeft(t *testing.T, h *host, when string) {
	t.Helper()
	named, cleanup, spares := stateDirProcs(h)
	if v := append(leftLinks(h), append(append(named, cleanup...), spares...)...); len(v) > 0 {
		t.Fatalf("%s: left behind:\n%s", when, strings.Join(v, "\n"))
	}
}

// TestDownAllCorruptProject: `down --all` with one project record that
// cannot be read (truncated, garbage) removes every project, that one
// with the others, and everything they brought up (issue 32: it exited
// 1 and removed nothing, leaving helpers, bridges, TAPs and tables).
func TestDownAllCorruptProject(t *testing.T) {
	h := newHost(t)
	a := h.WriteFile("a.yaml", "vms:\n  a1:\n    networks:\n      - vmnet: shared\n")
	b := h.WriteFile("b.yaml", "vms:\n  b1:\n    networks:\n      - vmnet: isolated\n")
	h.MustVmnetctl("up", "-f", a, "-p", "a", "--metrics-addr", "off")
	h.MustVmnetctl("up", "-f", b, "-p", "b", "--metrics-addr", "off")
	if err := os.WriteFile(filepath.Join(h.StateDir(), "projects", "b.json"), []byte(`{"name": "b", "files": [{"pa`), 0o600); err != nil {
		t.Fatal(err)
	}
	out := h.MustVmnetctl("down", "--all")
	for _, want := range []string{"Removing project a.", "Removing project b.", "Everything is down."} {
		if !strings.Contains(out, want) {
			t.Errorf("down --all says:\n%s\nwant %q", out, want)
		}
	}
	nothingLeft(t, h, "after down --all with a corrupt project")
}

// TestGarbageRuntimeRecord: with no controller running and runtime.json
// garbage, `status` says the record cannot be read and what puts it right,
// and exits 0 (issue 32: it failed); the next `up` starts afresh from it,
// and `down --all` leaves nothing.
func TestGarbageRuntimeRecord(t *testing.T) {
	h := newHost(t)
	vms := h.WriteFile("vms.yaml", "vms:\n  a1:\n    networks:\n      - vmnet: shared\n")
	h.MustVmnetctl("up", "-f", vms, "--metrics-addr", "off")
	pid := h.controllerPID()
	syscall.Kill(pid, syscall.SIGKILL)
	testutil.Eventually(t, 30*time.Second, func() bool { return syscall.Kill(pid, 0) != nil }, "the killed controller to go")
	if err := os.WriteFile(filepath.Join(h.StateDir(), "runtime.json"), []byte("\x00garbage{"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := h.MustVmnetctl("status")
	if !strings.Contains(out, "runtime.json") || !strings.Contains(out, "vmnetctl up") {
		t.Errorf("status with a garbage runtime record says:\n%s\nwant it named, and `vmnetctl up`", out)
	}
	h.MustVmnetctl("up", "-f", vms, "--metrics-addr", "off")
	if st := h.Status(); len(st.Attachments) != 1 || st.Attachments[0].State != "running" {
		t.Errorf("after up, the attachments are %+v", st.Attachments)
	}
	h.MustVmnetctl("down", "--all")
	nothingLeft(t, h, "after down --all")
}

// TestDownAllEverythingCorrupt: with the controller killed and every
// record garbage (each project's, runtime.json), `down --all` still
// removes everything of this state dir's: the records are a cache, the
// marks on the kernel's objects the truth (issue 32).
func TestDownAllEverythingCorrupt(t *testing.T) {
	h := newHost(t)
	a := h.WriteFile("a.yaml", "vms:\n  a1:\n    networks:\n      - vmnet: shared\n")
	b := h.WriteFile("b.yaml", "vms:\n  b1:\n    networks:\n      - vmnet: isolated\n")
	h.MustVmnetctl("up", "-f", a, "-p", "a", "--metrics-addr", "off")
	h.MustVmnetctl("up", "-f", b, "-p", "b", "--metrics-addr", "off")
	pid := h.controllerPID()
	syscall.Kill(pid, syscall.SIGKILL)
	testutil.Eventually(t, 30*time.Second, func() bool { return syscall.Kill(pid, 0) != nil }, "the killed controller to go")
	for _, f := range []string{"projects/a.json", "projects/b.json", "runtime.json"} {
		if err := os.WriteFile(filepath.Join(h.StateDir(), f), []byte("\x00garbage{"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	h.MustVmnetctl("down", "--all")
	nothingLeft(t, h, "after down --all with every record garbage")
}
