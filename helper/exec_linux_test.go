package helper_test

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/helper"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/procid"
	"github.com/vmnetctl/vmnetctl/relay"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestHelperExecsRelay: set up, a helper becomes vmnetctl-relay (found
// next to vmnetctl) and keeps its identity: the same pid, start time and
// command line, which is what the controller knows a helper by; dropped
// to the VM's owner, it is still not dumpable. It relays and stops on
// SIGTERM as before. Without vmnetctl-relay beside it, or with one the
// kernel will not run, the helper relays in its own process, says so, and
// still stops on SIGTERM. vmnetctl-helper, run with the command line the
// controller gives it, does the same: it execs vmnetctl-relay beside it.
func TestHelperExecsRelay(t *testing.T) {
	f := newFixture(t)
	lone := filepath.Join(t.TempDir(), "vmnetctl")
	b, err := os.ReadFile(vmnetctlBin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lone, b, 0o755); err != nil {
		t.Fatal(err)
	}
	// Beside a vmnetctl-relay the kernel will not run (ENOEXEC): the exec
	// fails after the helper gave up its signal handlers for it.
	brokenDir := t.TempDir()
	broken := filepath.Join(brokenDir, "vmnetctl")
	if err := os.WriteFile(broken, b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(brokenDir, relay.Binary), []byte("not a program\n"), 0o711); err != nil {
		t.Fatal(err)
	}
	helperBin := filepath.Join(filepath.Dir(vmnetctlBin), helper.Binary)
	for _, tc := range []struct {
		name, bin, exe string
		args           []string
		// asHelper: vmnetctl-helper, with the command line the controller
		// gives it (helper.Program).
		asHelper  bool
		inProcess bool
	}{
		{name: "with vmnetctl-relay", bin: vmnetctlBin, exe: relay.Binary},
		{name: "as the VM's owner", bin: vmnetctlBin, exe: relay.Binary, args: []string{"--uid", strconv.Itoa(ownerID), "--gid", strconv.Itoa(ownerID)}},
		{name: "alone", bin: lone, exe: "vmnetctl", inProcess: true},
		{name: "a vmnetctl-relay that does not run", bin: broken, exe: "vmnetctl", inProcess: true},
		{name: "vmnetctl-helper", bin: helperBin, exe: relay.Binary, asHelper: true},
		{name: "vmnetctl-helper, as the VM's owner", bin: helperBin, exe: relay.Binary, asHelper: true,
			args: []string{"--uid", strconv.Itoa(ownerID), "--gid", strconv.Itoa(ownerID)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func(old string) { vmnetctlBin = old }(vmnetctlBin)
			defer func() { runAsController = false }()
			vmnetctlBin, runAsController = tc.bin, tc.asHelper
			tap := openTap(t, f.vm, "vmeth0", false, 0)
			path := filepath.Join(f.dir, "helper.sock")
			h := f.startHelper(t, nil, append([]string{"--socket", path, "--stats-interval", "60"}, tc.args...)...)
			pid := h.cmd.Process.Pid
			if tc.args != nil {
				// Dropped to the VM's owner, and still not dumpable: /proc
				// shows its files as root's, so that owner cannot trace it
				// or use its descriptors.
				var st unix.Stat_t
				if err := unix.Stat("/proc/"+strconv.Itoa(pid)+"/fd", &st); err != nil {
					t.Fatal(err)
				}
				if st.Uid != 0 {
					t.Errorf("/proc/%d/fd is uid %d's: the relay running as uid %d is dumpable", pid, st.Uid, ownerID)
				}
			}
			exe, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe")
			if err != nil {
				t.Fatal(err)
			}
			if filepath.Base(exe) != tc.exe {
				t.Errorf("the ready helper runs %s, want %s", exe, tc.exe)
			}
			id, err := procid.Read(pid)
			if err != nil {
				t.Fatal(err)
			}
			// `ip netns exec NS` execs the rest of its arguments.
			if want := h.cmd.Args[4:]; !slices.Equal(id.Cmdline, want) {
				t.Errorf("command line %q, want the helper's own %q", id.Cmdline, want)
			}
			idle := testutil.PrivateKB(t, pid)
			conn := dialSocket(t, f.dir, path)
			r := startRelay(tap, conn, 0)
			f.setupVM(t, "vmeth0", h.ready.MACAddress)
			testutil.Eventually(t, 10*time.Second, func() bool { return f.vm.Ping(gateway, 1) == nil }, "ping from the VM")
			t.Logf("%s: private anonymous memory %d kB idle, %d kB once it relayed", tc.name, idle, testutil.PrivateKB(t, pid))
			if again, err := procid.Read(pid); err != nil || again.StartTime != id.StartTime {
				t.Errorf("identity after relaying: %+v, %v; want start time %d", again, err, id.StartTime)
			}
			r.stop()
			h.terminate()
			if st, ok := h.lastStats(); !ok || st.VM.Packets == 0 {
				t.Errorf("last stats line %+v (found %v), want the VM's packets counted; stderr:\n%s", st, ok, h.stderr())
			}
			// Once it exited, its stderr is all read.
			inProcess := strings.Contains(h.stderr(), "relaying in this process")
			if inProcess != tc.inProcess {
				t.Errorf("says it relays in its own process: %v; stderr:\n%s", inProcess, h.stderr())
			}
			if _, err := os.Stat(path); err == nil {
				t.Errorf("socket %s left after SIGTERM", path)
			}
			os.Remove(filepath.Join(f.dir, "vm.sock"))
		})
	}
}

// TestHandOverEnvOwnSpec: a relay spec in the helper's environment (sudo
// may pass one through) never reaches vmnetctl-relay, only the helper's;
// nor does a GOMAXPROCS, in place of the relay's IdleEnv.
func TestHandOverEnvOwnSpec(t *testing.T) {
	t.Setenv(relay.EnvSpec, `{"relearn":["/bin/sh","-c","evil"]}`)
	t.Setenv("GOMAXPROCS", "8")
	env := helper.HandOverEnv(`{"tap":5}`)
	var specs, procs []string
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, relay.EnvSpec+"="); ok {
			specs = append(specs, v)
		}
		if strings.HasPrefix(kv, "GOMAXPROCS=") {
			procs = append(procs, kv)
		}
	}
	if !slices.Equal(specs, []string{`{"tap":5}`}) {
		t.Errorf("specs handed over: %q, want only the helper's", specs)
	}
	if !slices.Equal(procs, []string{relay.IdleEnv}) {
		t.Errorf("GOMAXPROCS handed over: %q, want only %q", procs, relay.IdleEnv)
	}
}

// TestSudoHiddenCommands: the helper's hidden commands, run through sudo
// (anyone's who may run the helper so), touch no one else's ports: the
// relay's relearn command and the cleanup child are refused outright (a
// TAP that a helper run through sudo made carries no owner, so another
// user's could not be told from one's own).
func TestSudoHiddenCommands(t *testing.T) {
	f := newFixture(t)
	f.host.MustRun(t, "ip", "link", "add", "notaport", "type", "veth", "peer", "name", "notaport1")
	sudo := func(args ...string) (string, error) {
		cmd := f.host.Command(t.Context(), vmnetctlBin, append([]string{"--networks", f.networks, "helper"}, args...)...)
		cmd.Env = append(os.Environ(), "SUDO_UID=65534", "SUDO_GID=65534", "SUDO_USER=nobody")
		cmd.Stdin = strings.NewReader("")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := sudo("--network", "shared", "--uid", "65534", "--tap", "notaport", "--"+helper.RelearnFlag); err == nil || !strings.Contains(out, "not through sudo") {
		t.Errorf("--%s through sudo: %v, %s; want refused", helper.RelearnFlag, err, out)
	}
	if out, err := sudo("--"+helper.DeleteLinkFlag, "notaport"); err == nil || !strings.Contains(out, "not to be run through sudo") {
		t.Errorf("--%s notaport through sudo: %v, %s; want refused", helper.DeleteLinkFlag, err, out)
	}
	if !f.linkExists("notaport") {
		t.Errorf("the cleanup child, run through sudo, deleted link notaport")
	}
	// Another user's helper's TAP, made through sudo (it carries no
	// owner): not deleted either.
	f.host.MustRun(t, "ip", "tuntap", "add", "vmt-victim", "mode", "tap")
	f.host.MustRun(t, "ip", "link", "set", "vmt-victim", "alias", hostnet.TapMark("vmt-victim"))
	if out, err := sudo("--"+helper.DeleteLinkFlag, "vmt-victim"); err == nil {
		t.Errorf("--%s of another sudo helper's TAP through sudo: accepted, %s", helper.DeleteLinkFlag, out)
	}
	if !f.linkExists("vmt-victim") {
		t.Errorf("a command run through sudo deleted another helper's TAP")
	}
}

// TestProgram: the controller runs vmnetctl-helper beside vmnetctl only
// when it is trusted as vmnetctl-relay is (owned by root or by vmnetctl's
// owner, writable by nobody else); otherwise vmnetctl itself.
func TestProgram(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the trust rule for a helper run as root")
	}
	dir := t.TempDir()
	exe := filepath.Join(dir, "vmnetctl")
	bin := filepath.Join(dir, helper.Binary)
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := helper.Program(exe); got != exe {
		t.Errorf("without %s: Program = %s, want %s", helper.Binary, got, exe)
	}
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := helper.Program(exe); got != bin {
		t.Errorf("with %s: Program = %s, want it", helper.Binary, got)
	}
	for _, tc := range []struct {
		name string
		mode os.FileMode
		uid  int
	}{
		{"writable by others", 0o757, 0},
		{"writable by its group", 0o775, 0},
		{"not executable", 0o644, 0},
		{"owned by another user", 0o755, 65534},
	} {
		if err := os.Chmod(bin, tc.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(bin, tc.uid, 0); err != nil {
			t.Fatal(err)
		}
		if got := helper.Program(exe); got != exe {
			t.Errorf("%s %s: Program = %s, want %s", helper.Binary, tc.name, got, exe)
		}
	}
}
