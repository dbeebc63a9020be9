package helperexec

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// spareCmd is a command a spare of program prog could take.
func spareCmd(t *testing.T, prog string) *exec.Cmd {
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { null.Close() })
	cmd := exec.Command(prog, "helper", "--socket", "/run/x.sock")
	cmd.Env = []string{"PATH=/usr/bin", helperproto.EnvRelaySpec + "={}"}
	cmd.Stdout, cmd.Stderr, cmd.ExtraFiles = null, null, []*os.File{null}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd
}

// TestSpareKinds: only a command that a spare takes as an exec would
// have a kind; the spec is not part of it, the owner and environment are.
func TestSpareKinds(t *testing.T) {
	base, _, spec, ok := spareKindOf(spareCmd(t, "/bin/relay"), "/run/vmnetctl")
	if !ok || spec != "{}" {
		t.Fatalf("spareKindOf of a relay's command: ok %v, spec %q", ok, spec)
	}
	other := spareCmd(t, "/bin/relay")
	other.Env[1] = helperproto.EnvRelaySpec + `={"other":1}`
	if k, _, _, ok := spareKindOf(other, "/run/vmnetctl"); !ok || k != base {
		t.Errorf("another spec gives another kind")
	}
	for name, change := range map[string]func(*exec.Cmd){
		"an owner":         func(c *exec.Cmd) { c.SysProcAttr.Credential = &syscall.Credential{Uid: 65534, Gid: 65534} },
		"another variable": func(c *exec.Cmd) { c.Env = append(c.Env, "GODEBUG=x") },
		"another program":  func(c *exec.Cmd) { c.Path = "/bin/other" },
	} {
		c := spareCmd(t, "/bin/relay")
		change(c)
		if k, _, _, ok := spareKindOf(c, "/run/vmnetctl"); !ok || k == base {
			t.Errorf("%s: ok %v, the same kind %v", name, ok, k == base)
		}
	}
	for name, change := range map[string]func(*exec.Cmd){
		"a directory":       func(c *exec.Cmd) { c.Dir = "/" },
		"a stdin":           func(c *exec.Cmd) { c.Stdin = c.ExtraFiles[0] },
		"a pipe for stdout": func(c *exec.Cmd) { c.Stdout = &strings.Builder{} },
		"a chroot":          func(c *exec.Cmd) { c.SysProcAttr.Chroot = "/" },
		"no process group":  func(c *exec.Cmd) { c.SysProcAttr.Setpgid = false },
		"no spec":           func(c *exec.Cmd) { c.Env = c.Env[:1] },
		"a long command":    func(c *exec.Cmd) { c.Args = append(c.Args, strings.Repeat("x", helperproto.SpareRoom)) },
		"an empty last arg": func(c *exec.Cmd) { c.Args = append(c.Args, "") },
		"too many descriptors": func(c *exec.Cmd) {
			for range helperproto.MaxHandOverFiles {
				c.ExtraFiles = append(c.ExtraFiles, c.ExtraFiles[0])
			}
		},
	} {
		c := spareCmd(t, "/bin/relay")
		change(c)
		if _, _, _, ok := spareKindOf(c, "/run/vmnetctl"); ok {
			t.Errorf("%s: a spare would take it", name)
		}
	}
}

// TestSparesThatFail: a program that exits instead of waiting as a spare
// (a relay that cannot be one here) is started a few times
// (maxSpareFailures, and the few a refill had started before it knew),
// then no more; no start is handed to one.
func TestSparesThatFail(t *testing.T) {
	s := NewSpares(2, time.Minute, "/run/vmnetctl")
	defer s.Close()
	cmd := spareCmd(t, "/bin/false")
	failed := func() int {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, k := range s.kinds {
			return k.failed
		}
		return 0
	}
	round := func() {
		t.Helper()
		if _, _, _, ok := s.take(cmd); ok {
			t.Fatal("a spare that exited took a helper")
		}
		s.Refill()
		testutil.Eventually(t, time.Minute, func() bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			for _, k := range s.kinds {
				return k.filling == 0 && len(k.ready) == 0
			}
			return false
		}, "the refill to end and its spares to exit")
	}
	for try := 0; failed() < maxSpareFailures; try++ {
		if try == 10*maxSpareFailures {
			t.Fatalf("%d spares failed after %d rounds", failed(), try)
		}
		round()
	}
	given := failed()
	for range 3 {
		round()
	}
	if got := failed(); got != given || got > maxSpareFailures+2 {
		t.Errorf("%d spares failed, then %d: want no more started after %d", given, got, maxSpareFailures)
	}
}
