package controller_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/procid"
	"github.com/vmnetctl/vmnetctl/relay"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// faultVMs has eight attachments on both networks of networksYAML, one of
// them a TAP attachment (its helper makes the TAP itself).
const faultVMs = `
vms:
  f0:
    networks: [{vmnet: shared}, {vmnet: isolated}]
  f1:
    networks: [{vmnet: shared}, {vmnet: isolated}]
  f2:
    networks: [{vmnet: shared}]
  f3:
    networks: [{vmnet: shared, attach: tap}]
  f4:
    networks: [{vmnet: isolated}]
  f5:
    networks: [{vmnet: isolated}]
`

// faultAttachments is the number of attachments in faultVMs, and
// faultTapAttachments of those with attach: tap (a TAP that outlives its
// helper's fd, so the controller's link reaper deletes it); faultNetworks are the
// networks they use.
const (
	faultAttachments    = 8
	faultTapAttachments = 1
)

var faultNetworks = []string{"shared", "isolated"}

// faultSeedEnv replays a run: its seed, as the test logs it.
const faultSeedEnv = "VMNETCTL_FAULT_SEED"

// faultRounds is the schedule of TestFaultInjection, repeated: which
// operation is killed, and which one then runs to completion before the
// invariants are checked. Each killed up and restart starts from nothing,
// each killed down and replace from everything up; every pair of (killed,
// completed) occurs.
//
// A restart is a half-done up (killed), then an up whose fresh controller
// is killed in turn, at an instant of its own: while it adopts the helpers
// the first one recorded and stops those it had not (restore), or while it
// starts the rest. A replace is an up with every network's MTU changed,
// which replaces the networks: each is removed and created again, and its
// helpers restarted.
var faultRounds = []struct{ killed, completed string }{
	{"up", "up"},        // from nothing: a half-done up, then up
	{"down", "up"},      // from everything up: a half-done down, then up
	{"down", "down"},    // from everything up: a half-done down, then down
	{"up", "down"},      // from nothing: a half-done up, then down
	{"restart", "up"},   // from nothing: a half-done up and restart, then up
	{"replace", "up"},   // from everything up: a half-done replace, then up (a replace back)
	{"replace", "down"}, // from everything up: a half-done replace, then down
	{"restart", "down"}, // from nothing: a half-done up and restart, then down
}

// maxFaultDelay bounds the instant of the kill after the start of each
// operation: about as long as it takes here (up of faultVMs about 0.5 to
// 1 s, down --all 0.2 to 0.4 s, a replace about as long as an up), so that
// most kills land inside it and some after it. A restart's controller
// restores first: most of its kills land there.
var maxFaultDelay = map[string]time.Duration{"up": 1500 * time.Millisecond, "down": 600 * time.Millisecond,
	"restart": 800 * time.Millisecond, "replace": 1500 * time.Millisecond}

// faultMTU is the MTU of every network in a replace (networksYAML's have
// the default).
const faultMTU = 1400

// TestFaultInjection kills the controller with SIGKILL at random instants
// of `up`, `down --all`, a restart of the controller and a replace of the
// networks over many rounds, then runs `up` or `down --all` to completion
// and checks the invariants against /proc and the kernel, not against the
// state files: after up, one helper per attachment, each the one status
// names, counted too by a rule of the test's own (every process whose
// command line names the state dir), every TAP attachment's holder
// watched by a link reaper, every bridge and nftables table there and
// every TAP on its bridge; after down, nothing of the state dir's left: no
// process naming it, no reaper watching a TAP, no bridge (temporary ones
// included), TAP or table.
//
// The instants come from a seeded math/rand; the seed is logged, and
// VMNETCTL_FAULT_SEED=SEED replays a run.
func TestFaultInjection(t *testing.T) {
	h := newHost(t)
	file := h.WriteFile("faults.yaml", faultVMs)
	mtu := h.WriteFile("faults-mtu.yaml", strings.ReplaceAll(networksYAML, "    subnet:", fmt.Sprintf("    mtu: %d\n    subnet:", faultMTU)))

	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(faultSeedEnv); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("%s=%q: %v", faultSeedEnv, s, err)
		}
	}
	t.Logf("seed %d (replay with %s=%d)", seed, faultSeedEnv, seed)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	f := &faults{host: h, seed: seed, file: file, mtuNetworks: mtu, killed: map[[2]uint64]bool{}}

	const rounds = 16
	start := time.Now()
	for round := range rounds {
		f.round = round
		sched := faultRounds[round%len(faultRounds)]
		delayOf := func(op string) time.Duration { return time.Duration(rng.Int64N(int64(maxFaultDelay[op]))) }
		if sched.killed == "restart" {
			f.inject("up", delayOf("up"))
		}
		f.inject(sched.killed, delayOf(sched.killed))
		switch sched.completed {
		case "up":
			f.completeUp()
		case "down":
			f.completeDown()
		}
	}
	t.Logf("%d rounds in %v", rounds, time.Since(start).Round(time.Millisecond))
}

// faults is the state of TestFaultInjection, for its failure messages.
type faults struct {
	*host
	seed  uint64
	round int
	file  string
	// mtuNetworks is networksYAML with every network's MTU changed.
	mtuNetworks string
	// killed are the controllers (pid, start time) the test sent SIGKILL.
	killed map[[2]uint64]bool
}

// args are the arguments of op: "up" (and "restart") of the test's file,
// "replace", its up with the networks of mtuNetworks, or "down --all".
func (f *faults) args(op string) []string {
	switch op {
	case "up", "restart":
		return []string{"up", "-f", f.file, "--metrics-addr", "off"}
	case "replace":
		return []string{"up", "-f", f.file, "--metrics-addr", "off", "--networks", f.mtuNetworks}
	}
	return []string{"down", "--all"}
}

// fatalf fails the test naming the round and seed, with what the
// controller logged last and what the host has.
func (f *faults) fatalf(format string, args ...any) {
	f.t.Helper()
	links, _ := f.Run(context.Background(), "ip", "-br", "link")
	tables, _ := f.Run(context.Background(), "nft", "list", "tables")
	var procs []string
	for _, p := range f.helpers() {
		procs = append(procs, fmt.Sprintf("%d %s", p.PID, strings.Join(p.Cmdline, " ")))
	}
	f.t.Fatalf("round %d (seed %d, replay with %s=%d): %s\n--- helper processes:\n%s\n--- processes with controller.lock open:\n%s\n--- ip -br link:\n%s--- nft list tables:\n%s--- controller.log (tail):\n%s",
		f.round, f.seed, faultSeedEnv, f.seed, fmt.Sprintf(format, args...),
		strings.Join(procs, "\n"), strings.Join(f.lockHolders(), "\n"), links, tables, f.controllerLogTail(40))
}

// lockHolders are the processes that have the state dir's controller.lock
// open (any of them may hold its flock), with their state and command line.
func (f *faults) lockHolders() []string {
	lock := filepath.Join(f.StateDir(), "controller.lock")
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	var out []string
	seen := map[string]bool{}
	for _, fd := range fds {
		if target, err := os.Readlink(fd); err != nil || target != lock {
			continue
		}
		pid := strings.Split(fd, "/")[2]
		if seen[pid] {
			continue
		}
		seen[pid] = true
		stat, _ := os.ReadFile("/proc/" + pid + "/stat")
		cmdline, _ := os.ReadFile("/proc/" + pid + "/cmdline")
		out = append(out, fmt.Sprintf("%s (%s): %s", pid, strings.TrimSpace(string(stat)), strings.ReplaceAll(string(cmdline), "\x00", " ")))
	}
	return out
}

func (f *faults) controllerLogTail(n int) string {
	b, err := os.ReadFile(filepath.Join(f.StateDir(), "controller.log"))
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// helpers are the helper processes of the state dir, by the rule the
// controller uses (helperexec/strays.go, isHelperOf): `vmnetctl helper` or
// vmnet-helper with an argument naming a file in the state dir. Zombies and
// processes without a command line (yet) are not counted.
func (f *faults) helpers() []procid.Identity {
	prefix := filepath.Clean(f.StateDir()) + string(filepath.Separator)
	ps, err := procid.Processes(func(cmdline []string) bool {
		helper := false
		for i, arg := range cmdline {
			if (i == 1 && arg == "helper") || filepath.Base(arg) == "vmnet-helper" {
				helper = true
			}
		}
		return helper && slices.ContainsFunc(cmdline, func(a string) bool { return strings.HasPrefix(a, prefix) })
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return ps
}

// controllers are the `vmnetctl serve --state-dir DIR` processes of the
// state dir (`up` and `down` start the controller so).
func (f *faults) controllers() []procid.Identity {
	ps, err := procid.Processes(func(cmdline []string) bool {
		i := slices.Index(cmdline, "--state-dir")
		return slices.Contains(cmdline, "serve") && i >= 0 && i+1 < len(cmdline) && cmdline[i+1] == f.StateDir()
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return ps
}

// inject starts op and, after delay, kills the state dir's controller with
// SIGKILL, then op's client if it still runs.
func (f *faults) inject(op string, delay time.Duration) {
	f.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := f.VmnetctlCommand(ctx, f.args(op)...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		f.fatalf("starting %s: %v", op, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	// The fault injection instant: a random point of op (or after it).
	timer := time.NewTimer(delay)
	var clientErr error
	clientDone := false
	select {
	case <-timer.C:
	case clientErr = <-exited:
		clientDone = true
		<-timer.C
	}
	killed := f.killControllers()
	if !clientDone {
		cmd.Process.Signal(syscall.SIGKILL)
		clientErr = <-exited
	}
	// A controller that the client started between the two kills is part
	// of the same fault: no controller survives it.
	killed = append(killed, f.killControllers()...)
	testutil.Eventually(f.t, 10*time.Second, func() error {
		if cs := f.controllers(); len(cs) > 0 {
			return fmt.Errorf("round %d (seed %d): controllers still run after SIGKILL: %v", f.round, f.seed, cs)
		}
		return nil
	}, "the killed controller to be gone")

	state := "killed"
	if clientDone {
		state = fmt.Sprintf("had exited (%v)", clientErr)
	}
	lock := "free"
	if held := f.controllerLockHolders(); len(held) > 0 {
		lock = fmt.Sprintf("still held by %v", held)
	}
	f.t.Logf("round %d: %s, after %v: SIGKILL to controller(s) %v; the client %s; %d helper processes run; controller.lock %s",
		f.round, op, delay.Round(time.Millisecond), killed, state, len(f.helpers()), lock)
}

// controllerLockHolders are the pids (with their /proc state) that hold
// the flock of the state dir's controller.lock, from /proc/locks: a
// controller killed with SIGKILL holds it until the last of its threads
// has exited and its files are closed, which can be after its command line
// is gone and its main thread is a zombie (state Z) or while a thread
// sleeps in the kernel (state D).
func (f *faults) controllerLockHolders() []string {
	fi, err := os.Stat(filepath.Join(f.StateDir(), "controller.lock"))
	if err != nil {
		return nil
	}
	ino := strconv.FormatUint(fi.Sys().(*syscall.Stat_t).Ino, 10)
	locks, _ := os.ReadFile("/proc/locks")
	var out []string
	for _, l := range strings.Split(string(locks), "\n") {
		// 1: FLOCK  ADVISORY  WRITE 1234 00:2f:5678 0 EOF
		fields := strings.Fields(l)
		if len(fields) < 6 || fields[1] != "FLOCK" {
			continue
		}
		dev := strings.Split(fields[5], ":")
		if dev[len(dev)-1] != ino {
			continue
		}
		state := "gone"
		if stat, err := os.ReadFile("/proc/" + fields[4] + "/stat"); err == nil {
			if i := strings.LastIndexByte(string(stat), ')'); i >= 0 && i+3 < len(stat) {
				state = string(stat[i+2 : i+3])
			}
		}
		out = append(out, fields[4]+" (state "+state+")")
	}
	return out
}

// killControllers sends SIGKILL to every controller of the state dir and
// returns their pids.
func (f *faults) killControllers() []int {
	var pids []int
	for _, c := range f.controllers() {
		id := [2]uint64{uint64(c.PID), c.StartTime}
		if f.killed[id] {
			continue // dying: not reaped yet
		}
		f.killed[id] = true
		if syscall.Kill(c.PID, syscall.SIGKILL) == nil {
			pids = append(pids, c.PID)
		}
	}
	return pids
}

// run runs vmnetctl op to completion; its failure fails the round.
func (f *faults) run(op string) string {
	f.t.Helper()
	began := time.Now()
	out, err := f.Vmnetctl(f.args(op)...)
	if err != nil {
		f.fatalf("%s after the fault failed: %v", op, err)
	}
	f.t.Logf("round %d: %s completed in %v", f.round, op, time.Since(began).Round(time.Millisecond))
	return out
}

// completeUp runs up to completion and checks what runs.
func (f *faults) completeUp() {
	f.t.Helper()
	f.run("up")
	f.check("up", f.upViolations)
}

// completeDown runs down --all to completion and checks that nothing is left.
func (f *faults) completeDown() {
	f.t.Helper()
	out := f.run("down")
	// Not fatal: the rounds after it still check what the kernel and the
	// process table hold.
	if !strings.Contains(out, "Everything is down.") {
		f.t.Errorf("round %d (seed %d, replay with %s=%d): invariant broken after a completed down --all: it did not print %q; its stdout was %q",
			f.round, f.seed, faultSeedEnv, f.seed, "Everything is down.", out)
	}
	f.check("down --all", f.downViolations)
}

// check fails the round if violations finds any right after op returned.
// To tell a slow convergence from a lasting fault it then looks again for
// a few seconds and says which it is: the invariant is broken either way.
func (f *faults) check(op string, violations func() []string) {
	f.t.Helper()
	v := violations()
	if len(v) == 0 {
		return
	}
	later := "and still after 5 s more:"
	if err := testutil.Poll(5*time.Second, func() error {
		if w := violations(); len(w) > 0 {
			return errors.New(strings.Join(w, "\n  "))
		}
		return nil
	}); err == nil {
		later = "(5 s later they held: the state converged only after the command returned)"
	} else {
		later += "\n  " + strings.TrimPrefix(err.Error(), "still not true after 5s: ")
	}
	f.fatalf("invariants broken after a completed %s:\n  %s\n%s", op, strings.Join(v, "\n  "), later)
}

// upViolations are the invariants after a completed up that do not hold:
// exactly one helper process per attachment; each attachment running, with
// one of those processes as its pid; every network's bridge and both its
// nftables tables in the kernel; every helper's TAP a port of its
// network's bridge.
func (f *faults) upViolations() []string {
	var v []string
	procs := f.helpers()
	if len(procs) != faultAttachments {
		v = append(v, fmt.Sprintf("one helper per attachment: %d helper processes for %d attachments", len(procs), faultAttachments))
	}
	named, cleanup, spares := stateDirProcs(f.host)
	if len(named) != faultAttachments {
		v = append(v, fmt.Sprintf("one helper per attachment: %d processes name the state dir, but for its controller and its spares, for %d attachments: %v", len(named), faultAttachments, named))
	}
	// Spares are the live controller's: a killed one's went with it.
	live := map[string]bool{}
	for _, c := range f.controllers() {
		live[strconv.Itoa(c.PID)] = true
	}
	for _, sp := range spares {
		if f := strings.Fields(sp); len(f) < 2 || !live[strings.TrimSuffix(f[1], ":")] {
			v = append(v, fmt.Sprintf("a spare relay whose controller is gone: %s", sp))
		}
	}
	if n := watchedHelpers(f.host, procs); n != faultTapAttachments {
		v = append(v, fmt.Sprintf("every TAP attachment's TAP watched for its deletion: %d helpers hold a pipe a link reaper or cleanup child reads, for %d TAP attachments: %v", n, faultTapAttachments, cleanup))
	}
	byPID := map[int]procid.Identity{}
	for _, p := range procs {
		byPID[p.PID] = p
	}
	st, err := f.ReadStatus()
	if err != nil {
		return append(v, fmt.Sprintf("status --json: %v", err))
	}
	if !st.Controller.Running {
		v = append(v, "a controller runs after up: status says none does")
	}
	if len(st.Attachments) != faultAttachments {
		v = append(v, fmt.Sprintf("status lists every attachment: %d attachments, want %d", len(st.Attachments), faultAttachments))
	}
	pidOwners := map[int][]string{}
	for _, a := range st.Attachments {
		key := fmt.Sprintf("%s/%d", a.VM, a.Index)
		if a.State != ctlapi.StateRunning {
			v = append(v, fmt.Sprintf("%s is running: it is %s (%s)", key, a.State, a.Error))
		}
		if _, ok := byPID[a.PID]; !ok {
			v = append(v, fmt.Sprintf("%s's pid %d is one of the helper processes: it is not", key, a.PID))
		}
		pidOwners[a.PID] = append(pidOwners[a.PID], key)
		if a.Tap == "" {
			v = append(v, fmt.Sprintf("%s has a TAP: status names none", key))
			continue
		}
		br := api.BridgeName(a.Network)
		ports, err := f.Run(context.Background(), "ip", "-o", "link", "show", "master", br)
		if err != nil || !slices.Contains(linkNames(ports), a.Tap) {
			v = append(v, fmt.Sprintf("%s's TAP %s is a port of %s: it is not (ports: %v, %v)", key, a.Tap, br, linkNames(ports), err))
		}
	}
	for pid, keys := range pidOwners {
		if len(keys) > 1 {
			v = append(v, fmt.Sprintf("one helper per attachment: %v all name pid %d", keys, pid))
		}
	}
	for _, id := range faultNetworks {
		br := api.BridgeName(id)
		if _, err := f.Run(context.Background(), "ip", "link", "show", br); err != nil {
			v = append(v, fmt.Sprintf("network %s's bridge %s exists: %v", id, br, err))
		}
		for _, family := range []string{"inet", "bridge"} {
			if _, err := f.Run(context.Background(), "nft", "list", "table", family, hostnet.TableName(id)); err != nil {
				v = append(v, fmt.Sprintf("network %s's nftables table %s %s exists: %v", id, family, hostnet.TableName(id), err))
			}
		}
	}
	return v
}

// downViolations are the invariants after a completed down --all that do
// not hold: no helper or controller process of the state dir, no vmn-*
// bridge, no vmt-* TAP, no vmnetctl-* nftables table in the host namespace.
func (f *faults) downViolations() []string {
	var v []string
	if ps := f.helpers(); len(ps) > 0 {
		v = append(v, fmt.Sprintf("no helper process: %d run (%v)", len(ps), pidsOf(ps)))
	}
	if cs := f.controllers(); len(cs) > 0 {
		v = append(v, fmt.Sprintf("no controller process: %v run", pidsOf(cs)))
	}
	named, cleanup, spares := stateDirProcs(f.host)
	if len(named)+len(spares) > 0 {
		v = append(v, fmt.Sprintf("no process names the state dir: %v %v", named, spares))
	}
	if len(cleanup) > 0 {
		v = append(v, fmt.Sprintf("no cleanup child, no link reaper watching a TAP: %v", cleanup))
	}
	v = append(v, leftLinks(f.host)...)
	out, err := f.Run(context.Background(), "nft", "list", "tables")
	if err != nil {
		v = append(v, fmt.Sprintf("nft list tables: %v", err))
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "vmnetctl-") {
			v = append(v, fmt.Sprintf("no vmnetctl-* nftables table: %q is left", strings.TrimSpace(l)))
		}
	}
	return v
}

// stateDirProcs are, by a rule of the test's own rather than the
// controller's (isHelperOf), the processes whose command line names h's
// state dir anywhere, but the controllers (`serve`), and the cleanup
// children of VM ports (`helper --delete-link-on-eof`, or vmnetctl-relay's
// relay.CleanupArg, whose command line names only the port) and the link
// reapers that watch a TAP (relay.ReapArg, holding a pipe) in h's
// namespace; each as "PID: command line". Zombies, whose command line is
// empty, are not counted.
//
// The controller's spare relays, which name the state dir too, are
// spares: each "PID PPID: command line".
func stateDirProcs(h *host) (named, cleanup, spares []string) {
	dir := filepath.Clean(h.StateDir())
	inNS := map[int]bool{}
	for _, pid := range h.NS.Pids() {
		inNS[pid] = true
	}
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, path := range cmdlines {
		pid, _ := strconv.Atoi(strings.Split(path, "/")[2])
		b, err := os.ReadFile(path)
		if err != nil || len(b) == 0 || pid == os.Getpid() {
			continue
		}
		args := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
		desc := fmt.Sprintf("%d: %s", pid, strings.Join(args, " "))
		switch {
		case slices.Contains(args, "--delete-link-on-eof"), len(args) == 3 && args[1] == relay.CleanupArg:
			if inNS[pid] {
				cleanup = append(cleanup, desc)
			}
		case len(args) == 3 && args[1] == relay.ReapArg:
			// Watching: a pipe it holds a process of the namespace holds
			// too (a TAP's holder; after that one is gone the reaper may
			// hold its pipe to the holder a moment longer, until the
			// deletion's answer: not watching).
			if !inNS[pid] {
				continue
			}
			others := map[string]bool{}
			for other := range inNS {
				if other != pid {
					for p := range pipesOf(other) {
						others[p] = true
					}
				}
			}
			shared := 0
			for p := range pipesOf(pid) {
				if others[p] {
					shared++
				}
			}
			if shared > 0 {
				cleanup = append(cleanup, fmt.Sprintf("%s (%d pipes shared)", desc, shared))
			}
		case slices.Contains(args, "serve"):
		case helperproto.IsSpareOf(strings.Split(strings.TrimRight(string(b), "\x00"), "\x00"), h.StateDir()):
			spares = append(spares, fmt.Sprintf("%d %s: spare", pid, parentOf(pid)))
		case slices.ContainsFunc(args, func(a string) bool { return strings.Contains(a, dir) }):
			named = append(named, desc)
		}
	}
	return named, cleanup, spares
}

// pipesOf is the pipes process pid holds open ("pipe:[INODE]"), but
// those this test's process holds too: what whoever ran the test left
// open without close-on-exec, which every process started since holds.
func pipesOf(pid int) map[string]bool {
	pipes := openPipes(pid)
	for p := range openPipes(os.Getpid()) {
		delete(pipes, p)
	}
	return pipes
}

func openPipes(pid int) map[string]bool {
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	pipes := map[string]bool{}
	for _, fd := range fds {
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && strings.HasPrefix(l, "pipe:") {
			pipes[l] = true
		}
	}
	return pipes
}

// watchedHelpers is how many of helpers hold a pipe that a link reaper
// or a cleanup child in h's namespace holds too: a TAP's holder, whose
// TAP that process deletes once the holder is gone.
func watchedHelpers(h *host, helpers []procid.Identity) int {
	watched := map[string]bool{}
	for _, pid := range h.NS.Pids() {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		args := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
		if err == nil && len(args) == 3 && (args[1] == relay.ReapArg || args[1] == relay.CleanupArg) || slices.Contains(args, "--delete-link-on-eof") {
			for p := range pipesOf(pid) {
				watched[p] = true
			}
		}
	}
	n := 0
	for _, hp := range helpers {
		for p := range pipesOf(hp.PID) {
			if watched[p] {
				n++
				break
			}
		}
	}
	return n
}

// parentOf is process pid's parent's pid, as /proc/PID/status says it.
func parentOf(pid int) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "PPid:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}

// leftLinks are the links of vmnetctl's names left in h's namespace: vmn-*
// bridges, vmn.* temporary bridges, vmt-* TAPs and macvtaps.
func leftLinks(h *host) []string {
	out, err := h.Run(context.Background(), "ip", "-o", "link", "show")
	if err != nil {
		return []string{fmt.Sprintf("ip link: %v", err)}
	}
	var v []string
	for _, name := range linkNames(out) {
		if strings.HasPrefix(name, api.BridgePrefix) || strings.HasPrefix(name, "vmn.") || strings.HasPrefix(name, api.TapPrefix) {
			v = append(v, fmt.Sprintf("no vmn-* or vmn.* bridge, no vmt-* TAP: %s is left", name))
		}
	}
	return v
}

// linkNames are the interface names in `ip -o link show` output ("3:
// name@peer: <...>").
func linkNames(out string) []string {
	var names []string
	for _, l := range strings.Split(out, "\n") {
		fields := strings.Fields(l)
		if len(fields) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(fields[1], ":"), "@")
		names = append(names, name)
	}
	return names
}

func pidsOf(ps []procid.Identity) []int {
	var pids []int
	for _, p := range ps {
		pids = append(pids, p.PID)
	}
	return pids
}
