package procid

import (
	"bufio"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// threads is the number of OS threads of this process.
func threads(t *testing.T) int {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Threads:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	t.Fatal("no Threads: line")
	return 0
}

// Waiting for 200 processes, adopted ones (WaitExit) and children
// (WaitGone) alike, holds no thread per process: the waits sit in Go's
// network poller on pidfds.
func TestWaitHoldsNoThreadPerProcess(t *testing.T) {
	const n = 200
	var procs []*exec.Cmd
	t.Cleanup(func() {
		for _, c := range procs {
			c.Process.Kill()
			c.Wait()
		}
	})
	before := threads(t)
	var wg sync.WaitGroup
	done := make(chan int, n)
	for i := range n {
		c := exec.Command("sleep", "60")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		procs = append(procs, c)
		if i%2 == 0 {
			// Its command line appears once it has exec'd.
			var id Identity
			var err error
			for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
				if id, err = Read(c.Process.Pid); err == nil && len(id.Cmdline) > 0 && id.Cmdline[0] == "sleep" {
					break
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			wg.Go(func() { id.WaitExit(); done <- i })
		} else {
			wg.Go(func() { WaitGone(c.Process.Pid); done <- i })
		}
	}
	// The waits are under way once every goroutine is parked; give the
	// runtime the chance to start threads if it were going to.
	deadline := time.Now().Add(2 * time.Second)
	peak := 0
	for time.Now().Before(deadline) {
		peak = max(peak, threads(t))
		if len(done) > 0 {
			t.Fatalf("a wait returned while its process runs")
		}
		time.Sleep(50 * time.Millisecond) // sampling, not synchronisation
	}
	if peak-before > 20 {
		t.Errorf("waiting for %d processes took %d threads more (%d → %d): a thread per wait", n, peak-before, before, peak)
	}
	for _, c := range procs {
		c.Process.Signal(syscall.SIGKILL)
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(10 * time.Second):
		t.Fatalf("%d of %d waits returned within 10 s of the kills", len(done), n)
	}
}
