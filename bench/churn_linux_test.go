package bench

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/ops"
	"github.com/vmnetctl/vmnetctl/procid"
	relaypkg "github.com/vmnetctl/vmnetctl/relay"
	"github.com/vmnetctl/vmnetctl/statedir"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// perNetwork is how many of the fleet's VMs share a network: below the
// thousand a network takes (api.MaxPortsPerNetwork), so that the one VM
// attached and detached always has room.
const perNetwork = 990

// TestChurn measures a fleet's costs (issue 30), as docs/performance.md
// reports them: `up` of N VMs as the fleet grows (the cost per VM at each
// size, and its slope), one VM attached and detached with N running (a
// project of its own: `up -f one.yaml -p one`, then `down -p one`, each
// the whole command, and the controller's pass that served it), the
// controller's memory and threads, `status --json` and a metrics scrape
// at N, and the CPU that the controller and the helpers use while
// nothing happens. The fleet spreads over networks of perNetwork VMs.
// Sizes: VMNETCTL_CHURN_SIZES (default 0,100,1000,3000; at most 9,999,
// one less than a state dir's api.MaxAttachments, for the one VM more).
// Each helper is a process of about 8 threads: sizes past about 3,000
// need kernel.pid_max past the kernel's default 32,768, and the benchmark
// raises it to 4,194,304 for its run, as systemd sets it on most
// distributions, and puts it back after. VMNETCTL_CHURN_SHAPE=projects
// makes the fleet a project a VM (a CI runner's or a sandbox's jobs, each
// its own `up -p`), grown one `up` at a time; by default it is one
// project of N VMs. The state dir is a tmpfs of the benchmark's own, as
// the default /run/vmnetctl is on a systemd host (every attach makes a
// dozen files there; on ext4, after a fleet's files were deleted, each
// new one costs a scan of the recently deleted inodes);
// VMNETCTL_CHURN_STATE=disk keeps it in the test's temporary directory.
// VMNETCTL_CHURN_MAC=pinned gives every VM its MAC in its file, as lima's
// VMs have (the guard then holds each port to it: pinned); by default
// vmnetctl derives them. VMNETCTL_CHURN_ATTACH=tap makes every VM's
// attachment `attach: tap`.
// Each command runs as a user would, in the namespace but started by this
// process from a thread inside it, without `ip netns exec` (another
// process start, 8 ms or so here) before it. Only with VMNETCTL_BENCH=1
// (or churn): it takes minutes.
func TestChurn(t *testing.T) {
	if m := os.Getenv("VMNETCTL_BENCH"); m != "1" && m != "churn" {
		t.Skip("the churn benchmark runs with VMNETCTL_BENCH=1 or churn")
	}
	testutil.RequireRoot(t, "runs vmnetctl in a network namespace")
	sizes := []int{0, 100, 1000, 3000}
	if s := os.Getenv("VMNETCTL_CHURN_SIZES"); s != "" {
		sizes = nil
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil {
				t.Fatalf("VMNETCTL_CHURN_SIZES: %v", err)
			}
			sizes = append(sizes, n)
		}
	}
	if slices.Max(sizes) >= api.MaxAttachments {
		t.Fatalf("VMNETCTL_CHURN_SIZES: %d VMs and one more are past a state dir's %d attachments", slices.Max(sizes), api.MaxAttachments)
	}
	perProject := os.Getenv("VMNETCTL_CHURN_SHAPE") == "projects"
	raisePidMax(t, slices.Max(sizes))
	dir := t.TempDir()
	bin, err := testutil.BuildVmnetctl(dir)
	if err != nil {
		t.Fatal(err)
	}
	ns := testutil.NewNS(t, "churn")
	state := filepath.Join(dir, "state")
	if os.Getenv("VMNETCTL_CHURN_STATE") != "disk" {
		stateOnTmpfs(t, state)
	}
	networks := filepath.Join(dir, "networks.yaml")
	nets := slices.Max(sizes)/perNetwork + 1
	var nb strings.Builder
	nb.WriteString("vmnet:\n")
	for i := range nets {
		// 10.96.0.0/22, 10.96.4.0/22, ...: 1,022 addresses each.
		fmt.Fprintf(&nb, "  fleet%d:\n    subnet: 10.%d.%d.0/22\n", i, 96+i/64, (i%64)*4)
	}
	if err := os.WriteFile(networks, []byte(nb.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	vmnetctl := func(args ...string) (time.Duration, error) {
		cmd := exec.Command(bin, append([]string{"--state-dir", state, "--networks", networks}, args...)...)
		var out []byte
		var began time.Time
		// (The child starts in the namespace of the thread that forks it.)
		err := ns.Do(func() error {
			began = time.Now()
			var err error
			out, err = cmd.CombinedOutput()
			return err
		})
		if err != nil {
			return 0, fmt.Errorf("vmnetctl %s: %v\n%s", strings.Join(args, " "), err, tail(out))
		}
		return time.Since(began), nil
	}
	must := func(d time.Duration, err error) time.Duration {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	t.Cleanup(func() { vmnetctl("down", "--all") })
	one := filepath.Join(dir, "one.yaml")
	if err := os.WriteFile(one, fmt.Appendf(nil, "vms:\n  solo:\n    networks: [{vmnet: fleet0%s}]\n", entryExtra(maxFleet)), 0o644); err != nil {
		t.Fatal(err)
	}
	// A controller before the first size, kept up by the one VM's
	// network (network create): size 0 measures attach and detach
	// with a controller and its network already running.
	must(vmnetctl("network", "create", "fleet0", "--metrics-addr", "127.0.0.1:9464"))

	type row struct {
		n                    int
		grow                 time.Duration // up from the previous size to n
		perVM                time.Duration
		cpuPerVM             time.Duration // the machine's CPU time of the up, a VM
		attachP50, attachP99 time.Duration
		detachP50, detachP99 time.Duration
		// through the API (PUT and DELETE /v1/projects/NAME)
		apiAttachP50, apiAttachP99 time.Duration
		apiDetachP50, apiDetachP99 time.Duration
		passAtt, passDet           time.Duration // the controller's pass, p50
		status, statusMax, scrape  time.Duration
		rssMB                      float64
		threads                    int
		idle                       idleUse
	}
	var rows []row
	prev := 0
	var fleet, fleetProject string // the VM file of the largest size, its project
	// An attach by the command (20 ms of it the process's start) 20
	// times; through the API, cheaper, 100 times: its p99 is the second
	// slowest, not the slowest, which on a busy machine says more of the
	// machine than of vmnetctl.
	const reps, apiReps, statusReps = 20, 100, 5
	for _, n := range sizes {
		r := row{n: n}
		if n > 0 && perProject {
			for i := prev; i < n; i++ {
				fleet, fleetProject = filepath.Join(dir, fmt.Sprintf("p%05d.yaml", i)), fmt.Sprintf("p%05d", i)
				if err := os.WriteFile(fleet, fmt.Appendf(nil, "vms:\n  c%05d:\n    networks: [{vmnet: fleet%d%s}]\n", i, i/perNetwork, entryExtra(i)), 0o644); err != nil {
					t.Fatal(err)
				}
				busy := machineBusy(t)
				r.grow += must(vmnetctl("up", "-f", fleet, "-p", fleetProject))
				r.cpuPerVM += machineBusy(t) - busy
			}
			r.perVM = r.grow / time.Duration(n-prev)
			r.cpuPerVM /= time.Duration(n - prev)
		} else if n > 0 {
			fleetProject = "fleet"
			f := filepath.Join(dir, fmt.Sprintf("fleet%d.yaml", n))
			fleet = f
			var b strings.Builder
			b.WriteString("vms:\n")
			for i := range n {
				fmt.Fprintf(&b, "  c%05d:\n    networks: [{vmnet: fleet%d%s}]\n", i, i/perNetwork, entryExtra(i))
			}
			if err := os.WriteFile(f, []byte(b.String()), 0o644); err != nil {
				t.Fatal(err)
			}
			busy := machineBusy(t)
			r.grow = must(vmnetctl("up", "-f", f, "-p", "fleet"))
			r.perVM = r.grow / time.Duration(n-prev)
			r.cpuPerVM = (machineBusy(t) - busy) / time.Duration(n-prev)
		}
		prev = n
		var att, det, passAtt, passDet []time.Duration
		_, phases := lastPass(t, ns)
		phasesAtt, phasesDet := map[string]float64{}, map[string]float64{}
		for range reps {
			att = append(att, must(vmnetctl("up", "-f", one, "-p", "one")))
			d, ph := lastPass(t, ns)
			passAtt = append(passAtt, d)
			addDelta(phasesAtt, ph, phases)
			det = append(det, must(vmnetctl("down", "-p", "one")))
			d, phases = lastPass(t, ns)
			passDet = append(passDet, d)
			addDelta(phasesDet, phases, ph)
		}
		t.Logf("%d VMs: the passes' steps, ms an attach: %s; a detach: %s", n, perRep(phasesAtt, reps), perRep(phasesDet, reps))
		r.attachP50, r.attachP99 = quantile(att, 0.5), quantile(att, 0.99)
		r.detachP50, r.detachP99 = quantile(det, 0.5), quantile(det, 0.99)
		// The same VM attached and detached by a program that runs a
		// fleet, through the controller's API (one request each), not
		// a command each.
		var apiAtt, apiDet []time.Duration
		for range apiReps {
			a, d := apiAttach(t, statedir.Dir{Path: state})
			apiAtt, apiDet = append(apiAtt, a), append(apiDet, d)
		}
		r.apiAttachP50, r.apiAttachP99 = quantile(apiAtt, 0.5), quantile(apiAtt, 0.99)
		r.apiDetachP50, r.apiDetachP99 = quantile(apiDet, 0.5), quantile(apiDet, 0.99)
		r.passAtt, r.passDet = quantile(passAtt, 0.5), quantile(passDet, 0.5)
		// Several statuses: one may wait for the controller's lock
		// behind a pass (a full one at 10,000 takes seconds).
		var statuses []time.Duration
		for range statusReps {
			statuses = append(statuses, must(vmnetctl("status", "--json")))
		}
		r.status, r.statusMax = quantile(statuses, 0.5), slices.Max(statuses)
		r.scrape = scrape(t, ns)
		r.rssMB, r.threads = controllerUsage(t, state)
		// Over a resync and then some: the controller's full pass every
		// resync is most of what it does idle, and a window of 10 s
		// held one or not (6.6% or 22.5% at 9,999). And over a minute:
		// an idle Go process wakes once a minute (sysmon), a minute
		// from its start, so a fleet started together and a window of
		// 35 s after it saw no helper wake at all.
		r.idle = idleCPU(t, dir, state, max(ctlapi.DefaultResync(), sysmonPeriod)+5*time.Second, r.grow)
		rows = append(rows, r)
		t.Logf("%d VMs: attach p50 %v, detach p50 %v", n, r.attachP50, r.detachP50)
	}
	// A controller killed beside the running fleet, and the `up` that
	// starts another: its first pass adopts every helper and sets every
	// port again (the bandwidth step once dumped every qdisc a port).
	var again time.Duration
	if fleet != "" {
		killController(t, state)
		again = must(vmnetctl("up", "-f", fleet, "-p", fleetProject))
	}
	var down time.Duration
	if perProject {
		down = must(vmnetctl("down", "--all"))
	} else {
		down = must(vmnetctl("down", "-p", "fleet"))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| VMs | up to N (per VM; CPU a VM) | attach p50 / p99 (pass) | detach p50 / p99 (pass) | API attach p50 / p99 | API detach p50 / p99 | status --json p50 / max | scrape | controller RSS, threads | idle CPU (controller) | idle helper / Go's floor, us of CPU a minute |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %d | %v (%v; %v) | %v / %v (%v) | %v / %v (%v) | %v / %v | %v / %v | %v / %v | %v | %.0f MB, %d | %.1f%% (%.1f%%) | %.0f / %.0f |\n", r.n,
			r.grow.Round(time.Millisecond), r.perVM.Round(100*time.Microsecond), r.cpuPerVM.Round(100*time.Microsecond),
			r.attachP50.Round(time.Millisecond), r.attachP99.Round(time.Millisecond), r.passAtt.Round(time.Millisecond),
			r.detachP50.Round(time.Millisecond), r.detachP99.Round(time.Millisecond), r.passDet.Round(time.Millisecond),
			r.apiAttachP50.Round(100*time.Microsecond), r.apiAttachP99.Round(100*time.Microsecond),
			r.apiDetachP50.Round(100*time.Microsecond), r.apiDetachP99.Round(100*time.Microsecond),
			r.status.Round(time.Millisecond), r.statusMax.Round(time.Millisecond), r.scrape.Round(time.Millisecond), r.rssMB, r.threads, r.idle.all, r.idle.controller, r.idle.helper, r.idle.floor)
	}
	if fleet != "" {
		fmt.Fprintf(&b, "\nup of %d again, its controller killed: %v", prev, again.Round(time.Millisecond))
	}
	fmt.Fprintf(&b, "\ndown of %d: %v", prev, down.Round(time.Millisecond))
	var grown []row
	for _, r := range rows {
		if r.n >= 100 {
			grown = append(grown, r)
		}
	}
	if len(grown) >= 2 {
		first, last := grown[0], grown[len(grown)-1]
		fmt.Fprintf(&b, "; slope of the cost per VM of up from %d to %d: %.2fx", first.n, last.n, float64(last.perVM)/float64(first.perVM))
	}
	t.Log("\n" + b.String())
}

// apiAttach attaches one VM more (project "api") through the
// controller's API and detaches it again, and says how long each request
// took: the answer to each comes once the pass did it (the helper ready,
// or gone).
func apiAttach(t *testing.T, sd statedir.Dir) (attach, detach time.Duration) {
	t.Helper()
	snap, err := sd.Networks()
	if err != nil || snap == nil {
		t.Fatalf("networks of record: %v, %v", snap, err)
	}
	cl := ops.NewClient(sd)
	req := &ctlapi.ApplyRequest{Networks: *snap, NameGiven: true, Project: statedir.Project{Name: "api",
		Files: []statedir.ProjectFile{{Path: "api.yaml", Data: fmt.Appendf(nil, "vms:\n  apivm:\n    networks: [{vmnet: fleet0%s}]\n", entryExtra(maxFleet+1))}}}}
	began := time.Now()
	resp, err := cl.ApplyProject(context.Background(), req)
	attach = time.Since(began)
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Recorded || resp.Status == nil || len(resp.Status.Attachments) != 1 || resp.Status.Attachments[0].State != ctlapi.StateRunning {
		t.Fatalf("API attach: %+v", resp)
	}
	began = time.Now()
	if _, err := cl.RemoveProject(context.Background(), "api"); err != nil {
		t.Fatal(err)
	}
	return attach, time.Since(began)
}

// maxFleet is past any fleet VM's number: the one VM's and the API's
// VM's MACs (pinned) are maxFleet's and the next.
const maxFleet = 1 << 20

// entryExtra is what a network entry of a VM file says of the VM numbered
// i after its vmnet: with VMNETCTL_CHURN_MAC=pinned its macAddress, with
// VMNETCTL_CHURN_ATTACH=tap `attach: tap` (a persistent TAP, as
// firecracker and cloud-hypervisor open by name); "" by default.
func entryExtra(i int) string {
	var b strings.Builder
	if os.Getenv("VMNETCTL_CHURN_MAC") == "pinned" {
		fmt.Fprintf(&b, ", macAddress: \"52:56:%02x:%02x:%02x:%02x\"", i>>24&0xff, i>>16&0xff, i>>8&0xff, i&0xff)
	}
	if os.Getenv("VMNETCTL_CHURN_ATTACH") == "tap" {
		b.WriteString(", attach: tap")
	}
	return b.String()
}

// pidMaxFile is the kernel's limit on process ids, and so on tasks.
const pidMaxFile = "/proc/sys/kernel/pid_max"

// raisePidMax makes room for n helpers of about 8 threads each: it raises
// kernel.pid_max to systemd's 4,194,304 where it is lower than they need,
// and puts it back when the test ends.
func raisePidMax(t *testing.T, n int) {
	b, err := os.ReadFile(pidMaxFile)
	if err != nil {
		t.Fatal(err)
	}
	was := strings.TrimSpace(string(b))
	have, err := strconv.Atoi(was)
	if err != nil {
		t.Fatalf("%s: %v", pidMaxFile, err)
	}
	if have >= 10*n+4096 {
		return
	}
	if err := os.WriteFile(pidMaxFile, []byte("4194304"), 0o644); err != nil {
		t.Fatalf("%d helpers need kernel.pid_max past %d: %v", n, have, err)
	}
	t.Logf("kernel.pid_max raised from %s to 4194304 for the run", was)
	t.Cleanup(func() {
		if err := os.WriteFile(pidMaxFile, []byte(was), 0o644); err != nil {
			t.Errorf("putting kernel.pid_max back to %s: %v", was, err)
		}
	})
}

// quantile is the q quantile of ds (nearest rank).
func quantile(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}

// stateOnTmpfs mounts a tmpfs on state, a directory it makes, for the
// test, and unmounts it after the test's other cleanups (the controller
// and the helpers gone).
func stateOnTmpfs(t *testing.T, state string) {
	t.Helper()
	if err := os.Mkdir(state, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", state, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0750"); err != nil {
		t.Fatalf("a tmpfs for the state dir: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(state, unix.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", state, err)
		}
	})
}

// metrics is one scrape of the controller's metrics, from inside ns
// (busybox's wget: an HTTP client of this process would dial from another
// thread, outside the namespace), and how long it took.
func metrics(t *testing.T, ns *testutil.NS) (string, time.Duration) {
	began := time.Now()
	out, err := exec.Command("ip", "netns", "exec", ns.Name, "busybox", "wget", "-q", "-O", "-", "http://127.0.0.1:9464/metrics").Output()
	if err != nil {
		t.Fatalf("scraping the metrics: %v", err)
	}
	return string(out), time.Since(began)
}

// scrape times one scrape of the controller's metrics.
func scrape(t *testing.T, ns *testutil.NS) time.Duration {
	_, d := metrics(t, ns)
	return d
}

// lastPass is how long the controller's last pass took
// (vmnetctl_reconcile_duration_seconds), and the seconds all passes spent
// in each step (vmnetctl_reconcile_phase_seconds_total).
func lastPass(t *testing.T, ns *testutil.NS) (time.Duration, map[string]float64) {
	out, _ := metrics(t, ns)
	var last time.Duration
	found := false
	phases := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "vmnetctl_reconcile_duration_seconds "); ok {
			s, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			last, found = time.Duration(s*float64(time.Second)), true
		}
		if rest, ok := strings.CutPrefix(line, `vmnetctl_reconcile_phase_seconds_total{phase="`); ok {
			phase, v, _ := strings.Cut(rest, `"} `)
			s, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			phases[phase] = s
		}
	}
	if !found {
		t.Fatal("no vmnetctl_reconcile_duration_seconds in the metrics")
	}
	return last, phases
}

// addDelta adds to sum each step's seconds in now less those in before.
func addDelta(sum, now, before map[string]float64) {
	for k, v := range now {
		sum[k] += v - before[k]
	}
}

// perRep is each step's time in sum, in ms per repetition, the longest
// first ("start 11.2, desired 4.6, ...").
func perRep(sum map[string]float64, reps int) string {
	keys := slices.SortedFunc(maps.Keys(sum), func(a, b string) int { return cmp.Compare(sum[b], sum[a]) })
	var parts []string
	for _, k := range keys {
		if ms := 1000 * sum[k] / float64(reps); ms >= 0.05 {
			parts = append(parts, fmt.Sprintf("%s %.1f", k, ms))
		}
	}
	return strings.Join(parts, ", ")
}

// controllerUsage is the resident memory and threads of the controller of
// state dir state.
func controllerUsage(t *testing.T, state string) (float64, int) {
	status, err := os.ReadFile("/proc/" + controllerPID(t, state) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	var rss float64
	var threads int
	for _, line := range strings.Split(string(status), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 2 && f[0] == "VmRSS:":
			fmt.Sscan(f[1], &rss)
		case len(f) >= 2 && f[0] == "Threads:":
			fmt.Sscan(f[1], &threads)
		}
	}
	return rss / 1024, threads
}

// controllerPID is the pid of state dir state's controller.
func controllerPID(t *testing.T, state string) string {
	t.Helper()
	out, err := exec.CommandContext(context.Background(), "pgrep", "-f", "serve --state-dir "+state).Output()
	if err != nil {
		t.Fatalf("no controller for %s", state)
	}
	return strings.Fields(string(out))[0]
}

// killController kills state's controller (SIGKILL, as a crash would) and
// returns once it is gone, its helpers left running: no deadline, the
// wait is on its pidfd (procid).
func killController(t *testing.T, state string) {
	t.Helper()
	pid, err := strconv.Atoi(controllerPID(t, state))
	if err != nil {
		t.Fatal(err)
	}
	id, err := procid.Read(pid)
	if err != nil {
		t.Fatal(err)
	}
	if !id.Signal(syscall.SIGKILL) {
		t.Fatalf("controller %d gone before it was killed", pid)
	}
	id.WaitExit()
}

// idleUse is what the processes of a state dir cost over a window in
// which nothing happens.
type idleUse struct {
	all, controller float64 // % of one CPU: the controller and its helpers; the controller alone
	// Microseconds of CPU a minute: a helper (every process of the
	// state dir but the controller), and beside them, in the same
	// window, a Go program that only waits (testdata/goidle, started as
	// an idle relay is: GOMAXPROCS=1, no collection): the floor of a Go
	// process a VM.
	helper, floor float64
}

// idleCPU measures idleUse over d for state dir state (the controller and
// its helpers: their command lines name it), with as many floor programs
// beside them as there are helpers, up to maxFloor, built into dir, their
// starts spread over up (the helpers' `up`), a minute at most.
func idleCPU(t *testing.T, dir, state string, d, up time.Duration) idleUse {
	ctl := controllerPID(t, state)
	out, err := exec.Command("pgrep", "-f", state).Output()
	if err != nil {
		t.Fatalf("no process of %s", state)
	}
	pids := strings.Fields(string(out))
	floor := startFloor(t, dir, min(len(pids)-1, maxFloor), min(up, sysmonPeriod))
	began := time.Now()
	before, beforeCtl := cpuOf(pids, ctl), cpuOf([]string{ctl}, "")
	time.Sleep(d) // a measurement window, not a wait for anything
	after, afterCtl := cpuOf(pids, ctl), cpuOf([]string{ctl}, "")
	end := time.Now()
	secs := end.Sub(began).Seconds()
	u := idleUse{
		all:        100 * (after - before + afterCtl - beforeCtl).Seconds() / secs,
		controller: 100 * (afterCtl - beforeCtl).Seconds() / secs,
	}
	if n := len(pids) - 1; n > 0 {
		u.helper = float64((after - before).Microseconds()) / float64(n) / (secs / 60)
	}
	// Each floor program over its own window: from its start's end.
	var used, over time.Duration
	for _, f := range floor {
		used += cpuOf([]string{f.pid}, "") - f.cpu
		over += end.Sub(f.since)
	}
	if over > 0 {
		u.floor = float64(used.Microseconds()) / over.Minutes()
	}
	return u
}

// floorProc is a floor program whose start is over: its CPU time then,
// and when.
type floorProc struct {
	pid   string
	cpu   time.Duration
	since time.Time
}

// sysmonPeriod is how often Go's runtime wakes a process in which nothing
// runs (sysmon's sleep: half of forcegcperiod, whether it collects or not).
const sysmonPeriod = time.Minute

// maxFloor bounds the floor programs idleCPU starts.
const maxFloor = 1000

// startFloor starts n programs that only wait (testdata/goidle), as an
// idle relay is started (relay.IdleEnv), one after the other over spread
// (as the helpers' starts were, so that their sysmons wake spread over
// the minute as the helpers' do), and returns them once each one's start
// is over: no CPU used between two looks at it (spread, their wakes are
// never over all at once). They end with the test (their standard input
// closed).
func startFloor(t *testing.T, dir string, n int, spread time.Duration) []floorProc {
	if n <= 0 {
		return nil
	}
	bin, err := testutil.Build(dir, "github.com/vmnetctl/vmnetctl/bench/testdata/goidle")
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var cmds []*exec.Cmd
	t.Cleanup(func() {
		w.Close() // each one's read returns: it exits
		for _, c := range cmds {
			c.Wait()
		}
	})
	// Those whose start may not be over, with the CPU time last seen.
	pending := make([]floorProc, 0, n)
	began := time.Now()
	for i := range n {
		// Pacing the starts, not a wait for anything.
		time.Sleep(time.Until(began.Add(spread * time.Duration(i) / time.Duration(n))))
		c := exec.Command(bin)
		c.Stdin, c.Env = r, []string{relaypkg.IdleEnv}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, c)
		pending = append(pending, floorProc{pid: strconv.Itoa(c.Process.Pid), cpu: -1})
	}
	var settled []floorProc
	testutil.Eventually(t, time.Minute, func() error {
		left := pending[:0]
		for _, p := range pending {
			now := cpuOf([]string{p.pid}, "")
			if now == p.cpu {
				settled = append(settled, floorProc{p.pid, now, time.Now()})
				continue
			}
			p.cpu = now
			left = append(left, p)
		}
		pending = left
		if len(pending) > 0 {
			return fmt.Errorf("%d of the floor's programs still starting", len(pending))
		}
		return nil
	}, "%d programs that only wait, started", n)
	return settled
}

// cpuOf is the CPU time the processes pids have used, every thread's
// (schedstat: to the nanosecond, where stat's ticks would miss the short
// wakes of idle processes), but skip's.
func cpuOf(pids []string, skip string) time.Duration {
	var total time.Duration
	for _, pid := range pids {
		if pid == skip {
			continue
		}
		tasks, _ := filepath.Glob("/proc/" + pid + "/task/*/schedstat")
		for _, f := range tasks {
			b, err := os.ReadFile(f)
			if err != nil {
				continue // gone since
			}
			ns, _ := strconv.ParseInt(strings.Fields(string(b) + " 0")[0], 10, 64)
			total += time.Duration(ns)
		}
	}
	return total
}

// machineBusy is the CPU time the whole machine has spent, every CPU's,
// but idle and I/O wait (/proc/stat): across an up, what it cost in CPU
// (with whatever else ran meanwhile), which says more than its time when
// the machine is busy elsewhere.
func machineBusy(t *testing.T) time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		t.Fatal(err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	var busy int64
	for i, v := range f[1:] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("/proc/stat: %q", line)
		}
		// user nice system idle iowait irq softirq steal (guest and
		// guest_nice are in user and nice already)
		if i != 3 && i != 4 && i < 8 {
			busy += n
		}
	}
	return time.Duration(busy) * time.Second / 100 // USER_HZ
}

// tail is the last lines of out.
func tail(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return strings.Join(lines[max(0, len(lines)-10):], "\n")
}
