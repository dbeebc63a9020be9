package helper_test

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/helper"
	"github.com/vmnetctl/vmnetctl/helperexec"
	"github.com/vmnetctl/vmnetctl/relay"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// anonymousKB is a process's private anonymous memory (smaps_rollup).
func anonymousKB(t *testing.T, pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "Anonymous:" {
			kb, _ := strconv.Atoi(f[1])
			return kb
		}
	}
	t.Fatalf("no Anonymous line in smaps_rollup of %d", pid)
	return 0
}

// TestHelperExecsRelay: set up, a helper becomes vmnetctl-relay (found
// next to vmnetctl) and keeps its identity: the same pid, start time and
// command line, which is what the controller knows a helper by. It relays
// and stops on SIGTERM as before. Without vmnetctl-relay beside it, the
// helper relays in its own process, and says so.
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
	for _, tc := range []struct {
		name, bin, exe string
	}{
		{"with vmnetctl-relay", vmnetctlBin, relay.Binary},
		{"alone", lone, "vmnetctl"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func(old string) { vmnetctlBin = old }(vmnetctlBin)
			vmnetctlBin = tc.bin
			tap := openTap(t, f.vm, "vmeth0", false, 0)
			path := filepath.Join(f.dir, "helper.sock")
			h := f.startHelper(t, nil, "--socket", path, "--stats-interval", "60")
			pid := h.cmd.Process.Pid
			exe, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe")
			if err != nil {
				t.Fatal(err)
			}
			if filepath.Base(exe) != tc.exe {
				t.Errorf("the ready helper runs %s, want %s", exe, tc.exe)
			}
			id, err := helperexec.ReadProcIdentity(pid)
			if err != nil {
				t.Fatal(err)
			}
			// `ip netns exec NS` execs the rest of its arguments.
			if want := h.cmd.Args[4:]; !slices.Equal(id.Cmdline, want) {
				t.Errorf("command line %q, want the helper's own %q", id.Cmdline, want)
			}
			idle := anonymousKB(t, pid)
			conn := dialSocket(t, f.dir, path)
			r := startRelay(tap, conn, 0)
			f.setupVM(t, "vmeth0", h.ready.MACAddress)
			testutil.Eventually(t, 10*time.Second, func() bool { return f.vm.Ping(gateway, 1) == nil }, "ping from the VM")
			t.Logf("%s: private anonymous memory %d kB idle, %d kB once it relayed", tc.name, idle, anonymousKB(t, pid))
			if again, err := helperexec.ReadProcIdentity(pid); err != nil || again.StartTime != id.StartTime {
				t.Errorf("identity after relaying: %+v, %v; want start time %d", again, err, id.StartTime)
			}
			r.stop()
			h.terminate()
			if st, ok := h.lastStats(); !ok || st.VM.Packets == 0 {
				t.Errorf("last stats line %+v (found %v), want the VM's packets counted; stderr:\n%s", st, ok, h.stderr())
			}
			// Once it exited, its stderr is all read.
			inProcess := strings.Contains(h.stderr(), "relaying in this process")
			if inProcess != (tc.exe == "vmnetctl") {
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
// may pass one through) never reaches vmnetctl-relay, only the helper's.
func TestHandOverEnvOwnSpec(t *testing.T) {
	t.Setenv(relay.EnvSpec, `{"relearn":["/bin/sh","-c","evil"]}`)
	env := helper.HandOverEnv(`{"tap":5}`)
	var specs []string
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, relay.EnvSpec+"="); ok {
			specs = append(specs, v)
		}
	}
	if !slices.Equal(specs, []string{`{"tap":5}`}) {
		t.Errorf("specs handed over: %q, want only the helper's", specs)
	}
}
