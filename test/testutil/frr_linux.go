package testutil

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// frrDaemons is where Debian's frr package keeps zebra and bgpd.
const frrDaemons = "/usr/lib/frr"

// FRR is FRR's zebra and bgpd running in a test's namespace.
type FRR struct {
	ns       *NS
	run, dir string
	daemons  map[string]*exec.Cmd
}

// StartFRR runs FRR's zebra and bgpd in namespace n, as FRR's own
// convention for a namespace has it (frrinit.sh start NS): the
// namespace's name as their pathspace (-N), so their sockets are in
// /var/run/frr/NAME, where `vtysh -N NAME` finds them (and vmnetctl,
// running in the namespace). Their configuration starts empty; they are
// killed, and their run dir removed, when the test ends; their logs are
// shown if it failed. Without FRR the test skips (fails with CI=true).
func StartFRR(tb testing.TB, n *NS) *FRR {
	tb.Helper()
	for _, d := range []string{"zebra", "bgpd"} {
		if _, err := os.Stat(filepath.Join(frrDaemons, d)); err != nil {
			Missing(tb, "FRR's "+d, "apt-get install frr")
		}
	}
	RequireCommands(tb, "vtysh")
	// The daemons drop to the frr user, which owns their run dir.
	frrUser, err := user.Lookup("frr")
	if err != nil {
		Missing(tb, "the frr user", "apt-get install frr")
	}
	uid, _ := strconv.Atoi(frrUser.Uid)
	gid, _ := strconv.Atoi(frrUser.Gid)
	run := filepath.Join("/var/run/frr", n.Name)
	if err := os.MkdirAll(run, 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.Chown(run, uid, gid); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(run) }) // after the daemons are killed
	dir := tb.TempDir()
	f := &FRR{ns: n, run: run, dir: dir, daemons: map[string]*exec.Cmd{}}
	f.Start(tb, "zebra")
	// bgpd that finds no zebra tries again 10 s later.
	Eventually(tb, 10*time.Second, func() error {
		_, err := os.Stat(filepath.Join(run, "zserv.api"))
		return err
	}, "zebra in %s to listen", n.Name)
	tb.Cleanup(func() {
		if tb.Failed() {
			logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
			for _, l := range logs {
				b, _ := os.ReadFile(l)
				lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
				tb.Logf("%s's %s:\n%s", n.Name, filepath.Base(l), strings.Join(lines[max(0, len(lines)-30):], "\n"))
			}
		}
	})
	f.Start(tb, "bgpd")
	return f
}

// Start starts FRR's daemon d (zebra, bgpd) with an empty configuration,
// its output in the test's dir, and waits until it answers vtysh.
func (f *FRR) Start(tb testing.TB, d string) {
	tb.Helper()
	f.daemons[d] = f.ns.Start(tb, filepath.Join(f.dir, fmt.Sprintf("%s-%d.log", d, time.Now().UnixNano())), filepath.Join(frrDaemons, d), "-N", f.ns.Name, "-f", "/dev/null",
		"-i", filepath.Join(f.run, d+".pid"), "-P", "0", "--log", "stdout")
	Eventually(tb, 10*time.Second, func() error {
		out, err := f.Vtysh("show daemons")
		if err != nil || !strings.Contains(out, d) {
			return fmt.Errorf("%s does not answer (%v): %s", d, err, out)
		}
		return nil
	}, "FRR's %s in %s to answer", d, f.ns.Name)
}

// Restart kills daemon d and starts it again: it has lost what it was told.
func (f *FRR) Restart(tb testing.TB, d string) {
	tb.Helper()
	f.Stop(tb, d)
	f.Start(tb, d)
}

// Stop kills daemon d.
func (f *FRR) Stop(tb testing.TB, d string) {
	tb.Helper()
	pid := f.daemons[d].Process.Pid
	f.daemons[d].Process.Kill()
	Eventually(tb, 5*time.Second, func() error {
		if syscall.Kill(pid, 0) == nil {
			return fmt.Errorf("%s (pid %d) still runs", d, pid)
		}
		return nil
	}, "%s to end", d)
}

// Vtysh runs the commands on the namespace's FRR and returns vtysh's
// output (its error has the output too).
func (f *FRR) Vtysh(cmds ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	args := []string{"-N", f.ns.Name}
	for _, c := range cmds {
		args = append(args, "-c", c)
	}
	out, err := f.ns.Command(ctx, "vtysh", args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("vtysh %s: %w: %s", strings.Join(cmds, "; "), err, out)
	}
	return string(out), nil
}

// Apply gives the namespace's FRR configuration conf (as `vtysh -f`
// would read it from a file), and fails the test if vtysh does.
func (f *FRR) Apply(tb testing.TB, conf string) {
	tb.Helper()
	file := filepath.Join(tb.TempDir(), "frr.conf")
	if err := os.WriteFile(file, []byte(conf), 0o644); err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out, err := f.ns.Command(ctx, "vtysh", "-N", f.ns.Name, "-f", file).CombinedOutput(); err != nil {
		tb.Fatalf("vtysh -f with\n%s: %v: %s", conf, err, out)
	}
}

// Signal sends daemon d signal sig (SIGSTOP: a hung daemon).
func (f *FRR) Signal(tb testing.TB, d string, sig syscall.Signal) {
	tb.Helper()
	if err := f.daemons[d].Process.Signal(sig); err != nil {
		tb.Fatalf("%s: %v", d, err)
	}
}
