package procid

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// openFiles is how many descriptors this process has open.
func openFiles(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// A Child holds one descriptor while it runs and none once reaped, and
// its wait holds no thread: 100 children cost 100 descriptors (os/exec
// with a wait in the poller took two each, and a controller of 10,000
// helpers ran out of its 20,000).
func TestChildOneDescriptor(t *testing.T) {
	const n = 100
	fds, ths := openFiles(t), threads(t)
	var kids []*Child
	t.Cleanup(func() {
		for _, c := range kids {
			syscall.Kill(c.Pid, syscall.SIGKILL)
		}
	})
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		c, err := Start(exec.Command("sleep", "60"))
		if err != nil {
			t.Fatal(err)
		}
		kids = append(kids, c)
		wg.Go(func() { errs[i] = c.Wait() })
	}
	if got := openFiles(t) - fds; got != n {
		t.Errorf("%d children hold %d descriptors, want %d", n, got, n)
	}
	if got := threads(t) - ths; got > 10 {
		t.Errorf("waiting for %d children took %d threads more", n, got)
	}
	for _, c := range kids {
		syscall.Kill(c.Pid, syscall.SIGKILL)
	}
	wg.Wait()
	for i, err := range errs {
		if err == nil || err.Error() != "signal: killed" {
			t.Fatalf("child %d: Wait = %v, want signal: killed", i, err)
		}
	}
	if got := openFiles(t) - fds; got != 0 {
		t.Errorf("%d descriptors left open after the children were reaped", got)
	}
	for _, c := range kids {
		if err := syscall.Kill(c.Pid, 0); err != syscall.ESRCH {
			t.Errorf("child %d not reaped: kill 0 = %v", c.Pid, err)
		}
	}
}

// Start gives the child what os/exec would: its arguments, environment,
// directory, stdout and extra files; Wait words its exit as os/exec does.
func TestChildStartsAsExec(t *testing.T) {
	dir := t.TempDir()
	out, err := os.Create(dir + "/out")
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cmd := exec.Command("sh", "-c", `echo "$V $(pwd)"; echo extra >&3; read x; exit 3`)
	cmd.Env, cmd.Dir = []string{"V=seen"}, dir
	cmd.Stdout, cmd.ExtraFiles = out, []*os.File{w}
	c, err := Start(cmd)
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Wait(); err == nil || err.Error() != "exit status 3" {
		t.Errorf("Wait = %v, want exit status 3 (stdin is /dev/null: read returns)", err)
	}
	got, _ := os.ReadFile(dir + "/out")
	if want := "seen " + dir + "\n"; string(got) != want {
		t.Errorf("stdout %q, want %q", got, want)
	}
	if b, _ := io.ReadAll(r); string(b) != "extra\n" {
		t.Errorf("fd 3 carried %q, want extra", b)
	}
	c, err = Start(exec.Command("true"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Wait(); err != nil {
		t.Errorf("true: Wait = %v", err)
	}
	if _, err := Start(exec.Command("/nonexistent/helper")); err == nil {
		t.Error("a missing program started")
	}
}

// OnExit calls back once each child has exited, reaped, with no goroutine
// waiting for each meanwhile: 200 children, one goroutine more.
func TestChildOnExit(t *testing.T) {
	const n = 200
	var kids []*Child
	errs := make(chan error, n)
	reaped := 0 // errors read from errs
	t.Cleanup(func() {
		for _, c := range kids[reaped:] {
			syscall.Kill(c.Pid, syscall.SIGKILL)
		}
		// Reaped, their pidfds closed, before another test counts
		// descriptors.
		for ; reaped < len(kids); reaped++ {
			select {
			case <-errs:
			case <-time.After(time.Minute):
				t.Fatal("children not reaped a minute after they were killed")
			}
		}
	})
	reaperOf() // its goroutine, started before the count
	goroutines := runtime.NumGoroutine()
	for range n {
		c, err := Start(exec.Command("sleep", "60"))
		if err != nil {
			t.Fatal(err)
		}
		kids = append(kids, c)
		c.OnExit(func(err error) { errs <- err })
	}
	if got := runtime.NumGoroutine() - goroutines; got > 5 {
		t.Errorf("%d goroutines more while %d children run", got, n)
	}
	fds := openFiles(t)
	for _, c := range kids[:n/2] {
		syscall.Kill(c.Pid, syscall.SIGKILL)
	}
	for ; reaped < n/2; reaped++ {
		if err := <-errs; err == nil || err.Error() != "signal: killed" {
			t.Fatalf("OnExit got %v, want signal: killed", err)
		}
	}
	select {
	case err := <-errs:
		t.Fatalf("OnExit called for a child that runs: %v", err)
	default:
	}
	for _, c := range kids[:n/2] {
		if err := syscall.Kill(c.Pid, 0); err != syscall.ESRCH {
			t.Errorf("child %d not reaped: kill 0 = %v", c.Pid, err)
		}
	}
	testutil.Eventually(t, 10*time.Second, func() error {
		if got := fds - openFiles(t); got != n/2 {
			return fmt.Errorf("%d descriptors closed, want %d (a pidfd a child reaped)", got, n/2)
		}
		return nil
	}, "the reaped children's pidfds to be closed")
}

// TestIdentityOnExit: an adopted process's exit (not a child's: known by
// its identity) calls OnExit's function, with no goroutine waiting for
// each meanwhile, and its pidfd is closed then; a process already gone
// calls it at once.
func TestIdentityOnExit(t *testing.T) {
	const n = 100
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip(err)
	}
	// Started without os/exec, which holds a pidfd of its own a process.
	var pids []int
	exited := make(chan int, n)
	calls, killed := 0, 0 // of OnExit's functions, read from exited; of pids
	t.Cleanup(func() {
		for _, pid := range pids[killed:] {
			syscall.Kill(pid, syscall.SIGKILL)
			syscall.Wait4(pid, nil, 0, nil)
		}
		// The rest's functions called, their pidfds closed, before the
		// next test counts descriptors.
		for ; calls < len(pids); calls++ {
			select {
			case <-exited:
			case <-time.After(time.Minute):
				t.Fatalf("%d of %d OnExit functions called a minute after their processes were killed", calls, len(pids))
			}
		}
	})
	reaperOf()
	goroutines := runtime.NumGoroutine()
	fds := openFiles(t)
	for i := range n {
		pid, err := syscall.ForkExec(sleep, []string{"sleep", "60"}, &syscall.ProcAttr{})
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
		var id Identity
		testutil.Eventually(t, 10*time.Second, func() (err error) {
			id, err = Read(pid) // (its command line appears once it has exec'd)
			if err == nil && (len(id.Cmdline) == 0 || id.Cmdline[0] != "sleep") {
				err = fmt.Errorf("command line %q", id.Cmdline)
			}
			return err
		}, "process %d to exec sleep", pid)
		id.OnExit(func() { exited <- i })
	}
	if got := runtime.NumGoroutine() - goroutines; got > 5 {
		t.Errorf("%d goroutines more while %d adopted processes run", got, n)
	}
	if got := openFiles(t) - fds; got != n {
		t.Errorf("%d descriptors more, want %d (a pidfd a process)", got, n)
	}
	for _, pid := range pids[:n/2] {
		syscall.Kill(pid, syscall.SIGKILL)
		syscall.Wait4(pid, nil, 0, nil) // (as an adopted helper's parent, gone, would)
		killed++
	}
	seen := map[int]bool{}
	for ; calls < n/2; calls++ {
		seen[<-exited] = true
	}
	for i := range n / 2 {
		if !seen[i] {
			t.Errorf("process %d exited, its OnExit not called", i)
		}
	}
	select {
	case i := <-exited:
		calls++
		t.Fatalf("OnExit called for process %d, which runs", i)
	default:
	}
	testutil.Eventually(t, 10*time.Second, func() error {
		if got := openFiles(t) - fds; got != n/2 {
			return fmt.Errorf("%d descriptors more, want %d (the running processes' pidfds)", got, n/2)
		}
		return nil
	}, "the exited processes' pidfds to be closed")
	// One gone already: called at once.
	done := make(chan struct{})
	Identity{PID: pids[0]}.OnExit(func() { close(done) })
	<-done
}
