package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestChurn measures a fleet's costs (issue 30), as docs/performance.md
// reports them: `up` of N VMs on one shared network as it grows (the cost
// per VM at each size, and its slope), one VM attached and detached with N
// running (`up` of one more and of N again, each the whole command: the
// CLI, the controller's pass, the helper ready), the controller's memory
// and threads, and `status` and a metrics scrape at N. Only with
// VMNETCTL_BENCH=1 (or churn): it takes minutes.
func TestChurn(t *testing.T) {
	if m := os.Getenv("VMNETCTL_BENCH"); m != "1" && m != "churn" {
		t.Skip("the churn benchmark runs with VMNETCTL_BENCH=1 or churn")
	}
	testutil.RequireRoot(t, "runs vmnetctl in a network namespace")
	dir := t.TempDir()
	bin, err := testutil.BuildVmnetctl(dir)
	if err != nil {
		t.Fatal(err)
	}
	ns := testutil.NewNS(t, "churn")
	state := filepath.Join(dir, "state")
	networks := filepath.Join(dir, "networks.yaml")
	if err := os.WriteFile(networks, []byte("vmnet:\n  shared:\n    subnet: 10.98.0.0/22\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	vmnetctl := func(args ...string) (time.Duration, error) {
		cmd := exec.Command("ip", append([]string{"netns", "exec", ns.Name, bin, "--state-dir", state, "--networks", networks}, args...)...)
		began := time.Now()
		out, err := cmd.CombinedOutput()
		if err != nil {
			return 0, fmt.Errorf("vmnetctl %s: %v\n%s", strings.Join(args, " "), err, tail(out))
		}
		return time.Since(began), nil
	}
	t.Cleanup(func() { vmnetctl("down", "-p", "fleet") })
	up := func(n int) time.Duration {
		f := filepath.Join(dir, fmt.Sprintf("fleet%d.yaml", n))
		if _, err := os.Stat(f); err != nil {
			var b strings.Builder
			b.WriteString("vms:\n")
			for i := range n {
				fmt.Fprintf(&b, "  c%05d:\n    networks: [{vmnet: shared}]\n", i)
			}
			if err := os.WriteFile(f, []byte(b.String()), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		d, err := vmnetctl("up", "-f", f, "-p", "fleet", "--metrics-addr", "127.0.0.1:9464")
		if err != nil {
			t.Fatal(err)
		}
		return d
	}

	type row struct {
		n                    int
		grow                 time.Duration // up from the previous size to n
		perVM                time.Duration
		attachP50, attachP99 time.Duration
		detachP50, detachP99 time.Duration
		status, scrape       time.Duration
		rssMB                float64
		threads              int
	}
	var rows []row
	prev := 0
	const reps = 10
	for _, n := range []int{100, 500, 1000 - 1} {
		r := row{n: n, grow: up(n)}
		r.perVM = r.grow / time.Duration(n-prev)
		prev = n
		var att, det []time.Duration
		for range reps {
			att = append(att, up(n+1))
			det = append(det, up(n))
		}
		r.attachP50, r.attachP99 = quantile(att, 0.5), quantile(att, 0.99)
		r.detachP50, r.detachP99 = quantile(det, 0.5), quantile(det, 0.99)
		var err error
		if r.status, err = vmnetctl("status", "--json"); err != nil {
			t.Fatal(err)
		}
		r.scrape = scrape(t, ns)
		r.rssMB, r.threads = controllerUsage(t, state)
		rows = append(rows, r)
	}
	down, err := vmnetctl("down", "-p", "fleet")
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| VMs | up to N (per VM) | attach p50 / p99 | detach p50 / p99 | status --json | scrape | controller RSS, threads |\n|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %d | %v (%v) | %v / %v | %v / %v | %v | %v | %.0f MB, %d |\n", r.n, r.grow.Round(time.Millisecond), r.perVM.Round(100*time.Microsecond),
			r.attachP50.Round(time.Millisecond), r.attachP99.Round(time.Millisecond), r.detachP50.Round(time.Millisecond), r.detachP99.Round(time.Millisecond),
			r.status.Round(time.Millisecond), r.scrape.Round(time.Millisecond), r.rssMB, r.threads)
	}
	fmt.Fprintf(&b, "\ndown of %d: %v; slope of the cost per VM from 100 to %d: %.2fx\n", prev, down.Round(time.Millisecond), prev,
		float64(rows[len(rows)-1].perVM)/float64(rows[0].perVM))
	t.Log("\n" + b.String())
}

// quantile is the q quantile of ds (nearest rank).
func quantile(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}

// scrape times one scrape of the controller's metrics, from inside ns
// (busybox's wget: an HTTP client of this process would dial from another
// thread, outside the namespace).
func scrape(t *testing.T, ns *testutil.NS) time.Duration {
	began := time.Now()
	if out, err := exec.Command("ip", "netns", "exec", ns.Name, "busybox", "wget", "-q", "-O", "/dev/null", "http://127.0.0.1:9464/metrics").CombinedOutput(); err != nil {
		t.Fatalf("scraping the metrics: %v: %s", err, out)
	}
	return time.Since(began)
}

// controllerUsage is the resident memory and threads of the controller of
// state dir state.
func controllerUsage(t *testing.T, state string) (float64, int) {
	out, err := exec.CommandContext(context.Background(), "pgrep", "-f", "serve --state-dir "+state).Output()
	if err != nil {
		t.Fatalf("no controller for %s", state)
	}
	pid := strings.Fields(string(out))[0]
	status, err := os.ReadFile("/proc/" + pid + "/status")
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

// tail is the last lines of out.
func tail(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return strings.Join(lines[max(0, len(lines)-10):], "\n")
}
