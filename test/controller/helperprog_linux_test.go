package controller_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/controller"
	"github.com/vmnetctl/vmnetctl/helper"
	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/procid"
	"github.com/vmnetctl/vmnetctl/relay"
	"github.com/vmnetctl/vmnetctl/statedir"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestControllerPreparesHelper: the controller sets an attachment's helper
// up itself and starts only vmnetctl-relay (beside vmnetctl, as a package
// installs it), which says so in its log; the process shows `vmnetctl
// helper`'s command line, by which the controller knows it. So for a
// relay's helper and for one of `attach: tap`, which the relay holds. A
// helper it does not set up (attach: vhost-user) runs vmnetctl-helper.
func TestControllerPreparesHelper(t *testing.T) {
	h := newHost(t)
	vms := h.WriteFile("vms.yaml", "vms:\n  a:\n    networks:\n      - vmnet: shared\n  t:\n    networks:\n      - vmnet: shared\n        attach: tap\n  v:\n    networks:\n      - vmnet: shared\n        attach: vhost-user\n")
	h.MustVmnetctl("up", "-f", vms)
	st := h.Status()
	firstLine := func(vm string) string {
		log, err := os.ReadFile(statedir.Dir{Path: h.StateDir()}.HelperLogFile(vm + "/0"))
		if err != nil {
			t.Fatal(err)
		}
		first, _, _ := strings.Cut(string(log), "\n")
		return first
	}
	for _, vm := range []string{"a", "t"} {
		want := "running " + filepath.Join(filepath.Dir(h.Binary), relay.Binary) + ", set up by the controller"
		if first := firstLine(vm); !strings.Contains(first, want) {
			t.Errorf("%s: the helper's log begins %q, want it to say %q", vm, first, want)
		}
		pid := h.Attachment(st, vm).PID
		id, err := procid.Read(pid)
		if err != nil {
			t.Fatal(err)
		}
		if len(id.Cmdline) < 2 || id.Cmdline[0] != h.Binary || id.Cmdline[1] != "helper" {
			t.Errorf("%s: the helper's command line is %q, want %s helper ...", vm, id.Cmdline, h.Binary)
		}
		if exe, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe"); err != nil || filepath.Base(exe) != relay.Binary {
			t.Errorf("%s: the ready helper runs %s (%v), want %s", vm, exe, err, relay.Binary)
		}
	}
	want := "running " + h.Binary + " (" + filepath.Join(filepath.Dir(h.Binary), helper.Binary) + ") on Linux"
	if first := firstLine("v"); !strings.Contains(first, want) {
		t.Errorf("attach: vhost-user: the helper's log begins %q, want it to say %q", first, want)
	}
}

// TestSpareRelays: once the controller has started a helper, it keeps
// spare relays of that kind (helperexec.Spares), and the next VM's helper
// is one of them, handed its command line, descriptors and spec: it shows
// the command line a helper started cold shows, nothing after it, runs as
// the same user, and serves the VM (DHCP). When the controller is killed,
// its spares exit (their socket closed) and the helpers stay; a new
// controller adopts the one that was a spare (its command line is its
// identity).
func TestSpareRelays(t *testing.T) {
	h := newHost(t)
	a := h.WriteFile("a.yaml", "vms:\n  a:\n    networks:\n      - vmnet: shared\n")
	h.MustVmnetctl("up", "-f", a, "-p", "a")
	ctl := h.controllerPID()
	var spares []procid.Identity
	testutil.Eventually(t, time.Minute, func() error {
		if spares = spareRelays(t, h); len(spares) < controller.DefaultSpares {
			return fmt.Errorf("%d spares", len(spares))
		}
		return nil
	}, "the controller to start its spares")
	b := h.WriteFile("b.yaml", "vms:\n  b:\n    networks:\n      - vmnet: shared\n")
	h.MustVmnetctl("up", "-f", b, "-p", "b")
	st := h.Status()
	pa, pb := h.Attachment(st, "a").PID, h.Attachment(st, "b").PID
	if !slices.ContainsFunc(spares, func(id procid.Identity) bool { return id.PID == pb }) {
		t.Fatalf("b's helper is pid %d, none of the spares %v", pb, pidsOf(spares))
	}
	ida, erra := procid.Read(pa)
	idb, errb := procid.Read(pb)
	if erra != nil || errb != nil {
		t.Fatal(erra, errb)
	}
	// What a helper started cold shows: the command line the
	// controller recorded, before the start, as b's intent.
	var want []string
	for _, in := range (statedir.Dir{Path: h.StateDir()}).HelperIntents() {
		if in.Key == "b/0" {
			want = in.Argv
		}
	}
	if len(ida.Cmdline) < 2 || ida.Cmdline[1] != "helper" || !slices.Equal(idb.Cmdline, want) {
		t.Errorf("the spare's command line:\n%q\nwant the helper's, as b's intent recorded it:\n%q", idb.Cmdline, want)
	}
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pb) + "/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimRight(string(raw), "\x00"); got != strings.Join(idb.Cmdline, "\x00") || strings.Contains(got, helperproto.SpareArg+"\x00") {
		t.Errorf("/proc/%d/cmdline is %q", pb, raw)
	}
	if ua, ub := procLine(t, pa, "Uid:"), procLine(t, pb, "Uid:"); ua != ub {
		t.Errorf("a's helper runs as %q, b's (a spare) as %q", ua, ub)
	}
	if l := h.VM(h.Attachment(st, "b")).DHCP(t); l["ip"] == "" {
		t.Errorf("b leased %v", l)
	}
	// The descriptors an exec gives it, and no more sockets than a
	// helper started so has (the controller's socket closed).
	if fa, fb := fdKinds(t, pa), fdKinds(t, pb); !slices.Equal(fa[:8], fb[:8]) || countOf(fa, "socket") != countOf(fb, "socket") {
		t.Errorf("a's helper (started cold) has descriptors %q, b's (a spare) %q", fa, fb)
	}

	// VMs of another owner (a `sudo vmnetctl up` of user nobody's):
	// spares of their own, running as nobody before they take a helper.
	// (Nobody's helper binds its socket in the state dir, under the
	// test's directory: one nobody may pass through.)
	if err := os.Chmod(h.Dir, 0o711); err != nil {
		t.Fatal(err)
	}
	upAs := func(file, project string) {
		t.Helper()
		cmd := h.VmnetctlCommand(context.Background(), "up", "-f", file, "-p", project)
		cmd.Env = append(cmd.Env, "SUDO_UID=65534", "SUDO_GID=65534")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("up -p %s as nobody's: %v\n%s", project, err, out)
		}
	}
	upAs(h.WriteFile("c.yaml", "vms:\n  c:\n    networks:\n      - vmnet: shared\n"), "c")
	var nobodys []procid.Identity
	testutil.Eventually(t, time.Minute, func() error {
		nobodys = slices.DeleteFunc(spareRelays(t, h), func(id procid.Identity) bool { return !strings.HasPrefix(procLine(t, id.PID, "Uid:"), "65534\t") })
		if len(nobodys) < controller.DefaultSpares {
			return fmt.Errorf("%d spares run as nobody", len(nobodys))
		}
		return nil
	}, "the controller to start spares for nobody's VMs")
	upAs(h.WriteFile("d.yaml", "vms:\n  d:\n    networks:\n      - vmnet: shared\n"), "d")
	pd := h.Attachment(h.Status(), "d").PID
	if !slices.ContainsFunc(nobodys, func(id procid.Identity) bool { return id.PID == pd }) {
		t.Errorf("d's helper is pid %d, none of nobody's spares %v", pd, pidsOf(nobodys))
	}
	if uc, ud := procLine(t, h.Attachment(h.Status(), "c").PID, "Uid:"), procLine(t, pd, "Uid:"); uc != ud || !strings.HasPrefix(ud, "65534\t") {
		t.Errorf("c's helper runs as %q, d's (a spare) as %q", uc, ud)
	}

	// A spare that is stopped does not see its controller go: it goes
	// all the same (the kernel hangs up on a stopped process group that
	// its parent's exit orphans; the next controller stops what a dead
	// one's left).
	var stopped procid.Identity
	testutil.Eventually(t, time.Minute, func() error {
		for _, id := range spareRelays(t, h) {
			if procLine(t, id.PID, "Uid:") == procLine(t, pa, "Uid:") {
				stopped = id
				return nil
			}
		}
		return errors.New("none")
	}, "a spare of root's to stop")
	syscall.Kill(stopped.PID, syscall.SIGSTOP)
	syscall.Kill(ctl, syscall.SIGKILL)
	testutil.Eventually(t, time.Minute, func() error {
		for _, id := range append(spares, nobodys...) {
			if id.PID != pb && id.PID != pd && id.PID != stopped.PID && id.Alive() {
				return fmt.Errorf("spare %d still runs", id.PID)
			}
		}
		return nil
	}, "the killed controller's spares to exit")
	if !idb.Alive() {
		t.Fatal("b's helper went with the controller")
	}
	h.MustVmnetctl("up", "-f", b, "-p", "b")
	if got := h.Attachment(h.Status(), "b").PID; got != pb {
		t.Errorf("after the controller's restart b's helper is pid %d, want %d adopted", got, pb)
	}
	if stopped.Alive() {
		t.Errorf("the stopped spare %d of the killed controller still runs after another started", stopped.PID)
	}
	// No project left: no spare either, once down returns.
	h.MustVmnetctl("down", "--all")
	if left := spareRelays(t, h); len(left) > 0 {
		t.Errorf("after down --all, spares %v run", pidsOf(left))
	}
}

// fdKinds are what process pid's descriptors 0 on are, by number: a
// file's path with its last element dropped, or the kind of what is not
// a file (socket, pipe, anon_inode:...).
func fdKinds(t *testing.T, pid int) []string {
	t.Helper()
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var fds []int
	for _, e := range entries {
		n, _ := strconv.Atoi(e.Name())
		fds = append(fds, n)
	}
	slices.Sort(fds)
	var out []string
	for _, fd := range fds {
		l, _ := os.Readlink(dir + "/" + strconv.Itoa(fd))
		if kind, _, ok := strings.Cut(l, ":"); ok && !strings.HasPrefix(l, "/") {
			l = kind
		} else {
			l = filepath.Ext(l)
		}
		out = append(out, fmt.Sprintf("%d:%s", fd, l))
	}
	return append(out, make([]string, 8)...)
}

func countOf(kinds []string, kind string) int {
	n := 0
	for _, k := range kinds {
		if strings.HasSuffix(k, ":"+kind) {
			n++
		}
	}
	return n
}

// spareRelays are the spare relays of h's state dir that run (by their
// command line's mark, helperproto.IsSpareOf).
func spareRelays(t *testing.T, h *host) []procid.Identity {
	procs, err := procid.Processes(func(cmdline []string) bool { return helperproto.IsSpareOf(cmdline, h.StateDir()) })
	if err != nil {
		t.Fatal(err)
	}
	return procs
}

// procLine is the value of a line of /proc/PID/status ("" if none).
func procLine(t *testing.T, pid int, key string) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, key); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// TestSparesGoWithTheLastProject: a controller that stays once no
// project is left (a service's: `vmnetctl serve`) keeps no spare then;
// none runs once the `down` that removed the last project returns.
func TestSparesGoWithTheLastProject(t *testing.T) {
	h := newHost(t)
	ctx, cancel := context.WithCancel(context.Background())
	serve := h.VmnetctlCommand(ctx, "serve", "--metrics-addr", "off")
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); serve.Wait() })
	testutil.Eventually(t, time.Minute, func() error {
		if !h.Status().Controller.Running {
			return errors.New("not yet")
		}
		return nil
	}, "the controller to serve")
	a := h.WriteFile("a.yaml", "vms:\n  a:\n    networks:\n      - vmnet: shared\n")
	h.MustVmnetctl("up", "-f", a)
	testutil.Eventually(t, time.Minute, func() error {
		if n := len(spareRelays(t, h)); n < controller.DefaultSpares {
			return fmt.Errorf("%d spares", n)
		}
		return nil
	}, "the controller to start its spares")
	h.MustVmnetctl("down", "--all")
	if left := spareRelays(t, h); len(left) > 0 {
		t.Errorf("after down --all, spares %v run", pidsOf(left))
	}
	if !h.Status().Controller.Running {
		t.Error("the service's controller went with the last project")
	}
}
