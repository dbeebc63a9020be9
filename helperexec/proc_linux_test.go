package helperexec

import (
	"os/exec"
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
	var id ProcIdentity
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if id, err = ReadProcIdentity(cmd.Process.Pid); err == nil || time.Now().After(deadline) {
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
