package procid

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

func TestProcIdentity(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	// Right after exec the command line can read empty for a moment.
	var id Identity
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if id, err = Read(cmd.Process.Pid); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(id.Cmdline) != 2 || id.Cmdline[1] != "60" || id.StartTime == 0 {
		t.Fatalf("identity = %+v", id)
	}
	if !id.Alive() {
		t.Errorf("a running process is not alive")
	}
	other := id
	other.StartTime++
	if other.Alive() {
		t.Errorf("a different start time matched: a reused pid would be adopted")
	}
	other = id
	other.Cmdline = []string{"sleep", "61"}
	if other.Alive() {
		t.Errorf("a different command line matched")
	}
	cmd.Process.Kill()
	cmd.Wait()
	if id.Alive() {
		t.Errorf("a dead process is alive")
	}
}

// TestKill: Kill signals the recorded process only (not one whose identity
// differs, as a process that got its pid would), stops one that exits on
// SIGTERM without SIGKILL, and one that ignores SIGTERM with SIGKILL after
// the grace period.
func TestKill(t *testing.T) {
	start := func(script string) (*exec.Cmd, Identity, <-chan struct{}) {
		t.Helper()
		cmd := exec.Command("sh", "-c", script)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }() // reaps it, as a parent does
		t.Cleanup(func() { cmd.Process.Kill(); <-exited })
		var id Identity
		var err error
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			// (Before its exec the child has its parent's command line.)
			if id, err = Read(cmd.Process.Pid); (err == nil && len(id.Cmdline) > 0 && id.Cmdline[0] == "sleep") || time.Now().After(deadline) {
				break
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		return cmd, id, exited
	}
	_, id, exited := start("exec sleep 60")
	other := id
	other.StartTime++
	if other.Kill(time.Second) {
		t.Errorf("another identity took SIGKILL")
	}
	if other.Signal(syscall.SIGTERM) {
		t.Errorf("Signal says another identity's process was signalled")
	}
	select {
	case <-exited:
		t.Fatalf("a process whose identity differs from the recorded one was signalled")
	default:
	}
	if id.Kill(10 * time.Second) {
		t.Errorf("a process that exits on SIGTERM took SIGKILL")
	}
	<-exited

	_, id, exited = start(`trap "" TERM; exec sleep 60`) // (ignored across exec)
	if !id.Kill(100 * time.Millisecond) {
		t.Errorf("a process that ignores SIGTERM was not killed")
	}
	<-exited
}

// TestSelf: Self is this process's identity as Read gives it, a failed
// read is not kept (the next call reads again), and a caller that changes
// what it got changes nobody else's.
func TestSelf(t *testing.T) {
	selfMu.Lock()
	was, reader := selfID, readSelf
	selfID = nil
	readSelf = func() (Identity, error) { return Identity{}, syscall.EMFILE }
	selfMu.Unlock()
	t.Cleanup(func() { selfMu.Lock(); selfID, readSelf = was, reader; selfMu.Unlock() })
	if _, err := Self(); err == nil {
		t.Fatal("Self() with a failing read: no error")
	}
	selfMu.Lock()
	readSelf = reader
	selfMu.Unlock()
	id, err := Self()
	if err != nil {
		t.Fatal(err)
	}
	read, err := Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if !id.Equal(read) {
		t.Fatalf("Self() = %+v, Read = %+v", id, read)
	}
	id.Cmdline[0] = "changed"
	if again, _ := Self(); !again.Equal(read) {
		t.Errorf("Self() after a caller changed its copy: %+v", again)
	}
}
