package controller_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/hostnet"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/statedir"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestStrayNetworkAfterCrash: the controller made project B's network and
// crashed before it recorded it (runtime.json is written last, after the
// helpers start). B goes before the next controller's first pass while
// project A stays up: the network, which nothing records and no project
// wants, is removed, and A's is left alone.
func TestStrayNetworkAfterCrash(t *testing.T) {
	h := newHost(t)
	h.MustVmnetctl("up", "-p", "a", "-f", h.WriteFile("a.yaml", "vms:\n  a:\n    networks:\n      - vmnet: shared\n"))
	h.MustVmnetctl("up", "-p", "b", "-f", h.WriteFile("b.yaml", "vms:\n  b:\n    networks:\n      - vmnet: isolated\n"))
	aPID := h.Attachment(h.Status(), "a").PID

	// The crash, and the record as it was before B's pass.
	syscall.Kill(h.controllerPID(), syscall.SIGKILL)
	sd := statedir.Dir{Path: h.StateDir()}
	testutil.Eventually(t, 10*time.Second, func() error {
		if sd.ControllerAlive() {
			return errors.New("the controller still holds its lock")
		}
		return nil
	}, "the controller's exit")
	rt, found, err := sd.LoadRuntime()
	if err != nil || !found {
		t.Fatalf("runtime record: %v (found %v)", err, found)
	}
	var kept []*statedir.Project
	for _, p := range rt.AppliedProjects {
		if p.Name == "a" {
			kept = append(kept, p)
		}
	}
	if len(kept) == len(rt.AppliedProjects) {
		t.Fatalf("project b is not in the record to take out: %+v", rt.AppliedProjects)
	}
	rt.AppliedProjects = kept
	if err := sd.SaveRuntime(rt); err != nil {
		t.Fatal(err)
	}

	h.MustVmnetctl("down", "-p", "b")
	bridge := api.BridgeName("isolated")
	if out, err := h.Run(context.Background(), "ip", "link", "show", bridge); err == nil {
		t.Errorf("the network of the project that went is still up (%s):\n%s", bridge, out)
	}
	if out := h.MustRun(t, "nft", "list", "tables"); strings.Contains(out, hostnet.TableName("isolated")) {
		t.Errorf("the network of the project that went left its nftables tables:\n%s", out)
	}
	st := h.Status()
	if a := h.Attachment(st, "a"); a.PID != aPID || a.State != "running" {
		t.Errorf("project a's VM: %+v, want its helper %d running", a, aPID)
	}
	h.MustRun(t, "ip", "link", "show", api.BridgeName("shared"))
	h.MustVmnetctl("down", "--all")
}

// TestSocketGoesWithItsVM: a hung helper of a VM that is removed is killed,
// and its socket, lock and the VM's folder go with it (a helper stopped
// gracefully removes its own; a killed one cannot).
func TestSocketGoesWithItsVM(t *testing.T) {
	h := newHost(t)
	h.MustVmnetctl("up", "-f", h.WriteFile("vms.yaml", twoVMs))
	b := h.Attachment(h.Status(), "b")
	if b.Socket == "" {
		t.Fatalf("b has no socket: %+v", b)
	}
	for _, f := range []string{b.Socket, helperproto.SocketLock(b.Socket)} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("before: %v", err) // the control
		}
	}
	syscall.Kill(b.PID, syscall.SIGSTOP) // hung: it will not clean up
	h.MustVmnetctl("up", "-f", h.WriteFile("vms.yaml", "vms:\n  a:\n    networks:\n      - vmnet: shared\n"))
	if syscall.Kill(b.PID, 0) == nil {
		t.Errorf("b's hung helper %d still runs", b.PID)
	}
	for _, f := range []string{b.Socket, helperproto.SocketLock(b.Socket), filepath.Dir(b.Socket)} {
		if _, err := os.Stat(f); err == nil {
			t.Errorf("%s is left after b went", f)
		}
	}
	h.MustVmnetctl("down", "--all")
}

// TestRunKilled: `vmnetctl run` holds its project: a second run of the same
// VM is refused while it runs (it would take over the first's attachments);
// killed (-9), its project, helpers (the TAP attachment's, which would run
// on, too), TAP and networks go.
func TestRunKilled(t *testing.T) {
	h := newHost(t)
	vms := h.WriteFile("vms.yaml", "vms:\n  k:\n    networks:\n      - vmnet: shared\n      - vmnet: isolated\n        attach: tap\n")
	gate := filepath.Join(h.Dir, "gate")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	defer os.WriteFile(gate, nil, 0o644) // (the VM's command ends, whatever happens)
	run := h.VmnetctlCommand(ctx, "run", "-f", vms, "--vm", "k", "--", "sh", "-c", fmt.Sprintf(`while [ ! -e %s ]; do sleep 0.05; done`, gate))
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	var pids []int
	var tap string
	testutil.Eventually(t, 20*time.Second, func() error {
		pids, tap = nil, ""
		for _, a := range h.Status().Attachments {
			if a.VM == "k" && a.State == ctlapi.StateRunning && a.PID > 0 {
				pids = append(pids, a.PID)
				if a.Index == 1 {
					tap = a.Tap
				}
			}
		}
		if len(pids) != 2 || tap == "" {
			return fmt.Errorf("run's helpers: %v, TAP %q", pids, tap)
		}
		return nil
	}, "run's helpers")

	if _, err := h.Vmnetctl("run", "-f", vms, "--vm", "k", "--", "true"); err == nil || !strings.Contains(err.Error(), "already runs") {
		t.Errorf("a second run of the same VM: %v, want it refused", err)
	}
	for _, p := range pids {
		if syscall.Kill(p, 0) != nil {
			t.Errorf("the first run's helper %d is gone after the second run", p)
		}
	}
	h.MustRun(t, "ip", "link", "show", tap)

	syscall.Kill(run.Process.Pid, syscall.SIGKILL)
	run.Wait()
	testutil.Eventually(t, 30*time.Second, func() error {
		for _, p := range pids {
			if syscall.Kill(p, 0) == nil {
				return fmt.Errorf("helper %d still runs", p)
			}
		}
		if _, err := h.Run(ctx, "ip", "link", "show", tap); err == nil {
			return fmt.Errorf("TAP %s is still there", tap)
		}
		for _, br := range []string{api.BridgeName("shared"), api.BridgeName("isolated")} {
			if _, err := h.Run(ctx, "ip", "link", "show", br); err == nil {
				return fmt.Errorf("network bridge %s is still up", br)
			}
		}
		if ps, _ := (statedir.Dir{Path: h.StateDir()}).Projects(); len(ps) > 0 {
			return fmt.Errorf("projects left: %v", ps[0].Name)
		}
		return nil
	}, "what the killed run held to go")
}

// TestDaemonDropsInheritedFiles: `up` run with a descriptor its starter
// left open without close-on-exec (a CI runner's pipe) does not pass it
// on to the controller it starts, nor so to the helpers: the pipe's
// reader sees its end once `up` has exited, with the VMs still up.
func TestDaemonDropsInheritedFiles(t *testing.T) {
	h := newHost(t)
	vms := h.WriteFile("vms.yaml", twoVMs)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := h.VmnetctlCommand(ctx, "up", "-f", vms)
	cmd.ExtraFiles = []*os.File{w} // descriptor 3, not close-on-exec in up
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("up: %v\n%s", err, out)
	}
	w.Close()
	defer h.MustVmnetctl("down", "--all")
	if n := len(h.Status().Attachments); n != 2 {
		t.Fatalf("%d attachments up, want 2", n)
	}
	r.SetReadDeadline(time.Now().Add(time.Minute))
	var b [1]byte
	if n, err := r.Read(b[:]); err != io.EOF {
		t.Errorf("the pipe up inherited: read %d, %v; want EOF (its end held by the controller %d or a helper)", n, err, h.controllerPID())
	}
}
