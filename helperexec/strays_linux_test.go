package helperexec

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/procid"
	"github.com/vmnetctl/vmnetctl/statedir"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestKnownHelperPIDs: a fresh controller takes for strays only the helpers
// nothing accounts for. A helper a live `vmnetctl run` is starting (its
// intent recorded, its record not yet), and a process holding a project,
// are known; a helper whose starter died before recording it (a killed
// controller) and one without any record are strays.
func TestKnownHelperPIDs(t *testing.T) {
	sd := statedir.Dir{Path: filepath.Join(t.TempDir(), "state")}
	if err := sd.Init(); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(sd.HelpersDir(), 0o750); err != nil {
		t.Fatal(err)
	}
	// Fake helpers: a shell named vmnet-helper whose arguments name a
	// socket of the state dir (isHelperOf's rule), waiting in the builtin
	// read on a pipe that stays open. A shell that ran sleep would fork,
	// and the child, until it execs, shows the helper's command line too: a
	// third "stray" (a flake seen in CI).
	sh, err := os.ReadFile("/bin/sh")
	if err != nil {
		t.Skip(err)
	}
	fake := filepath.Join(t.TempDir(), "vmnet-helper")
	if err := os.WriteFile(fake, sh, 0o755); err != nil {
		t.Fatal(err)
	}
	start := func(argv ...string) (*exec.Cmd, procid.Identity) {
		t.Helper()
		cmd := exec.Command(argv[0], argv[1:]...)
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdin = r
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		r.Close()
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); w.Close() })
		// Its command line shows once exec has replaced the child's memory.
		var id procid.Identity
		testutil.Eventually(t, 5*time.Second, func() (err error) {
			id, err = procid.Read(cmd.Process.Pid)
			return err
		}, "the command line of %v", argv)
		return cmd, id
	}
	helperArgv := func(vm string) []string { return []string{fake, "-c", "read x", "sh", sd.SocketPath(vm, 0)} }

	_, run := start("/bin/sh", "-c", "read x") // a live `vmnetctl run`
	_, running := start(helperArgv("run")...)
	if err := sd.SaveHelperIntent(statedir.HelperIntent{Key: "run/0", Argv: helperArgv("run"), Starter: run}); err != nil {
		t.Fatal(err)
	}
	dead := run
	dead.StartTime++ // the same pid, another process: the killed controller
	_, orphan := start(helperArgv("orphan")...)
	if err := sd.SaveHelperIntent(statedir.HelperIntent{Key: "orphan/0", Argv: helperArgv("orphan"), Starter: dead}); err != nil {
		t.Fatal(err)
	}
	_, holder := start(helperArgv("holder")...)
	if err := sd.SaveProject(&statedir.Project{Name: statedir.HolderProjectPrefix + "1", Holder: &holder}); err != nil {
		t.Fatal(err)
	}
	_, stray := start(helperArgv("stray")...)

	known := KnownHelperPIDs(sd)
	for _, tc := range []struct {
		what  string
		pid   int
		known bool
	}{
		{"a live run's helper being started", running.PID, true},
		{"a project's holder", holder.PID, true},
		{"a helper of a dead starter", orphan.PID, false},
		{"a helper without any record", stray.PID, false},
	} {
		if known[tc.pid] != tc.known {
			t.Errorf("%s (pid %d): known %v, want %v", tc.what, tc.pid, known[tc.pid], tc.known)
		}
	}
	var got []int
	for _, p := range StrayHelpers(sd, func(pid int) bool { return known[pid] }) {
		got = append(got, p.PID)
	}
	slices.Sort(got)
	want := []int{orphan.PID, stray.PID}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("strays: %v, want %v (the dead starter's and the unrecorded one)", got, want)
	}
}
