package ops

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/helperexec"
)

// TestWaitStartingFollowsProgress: a starting controller that keeps
// moving (here it logs a line every 50 ms) is waited for past the stall
// window, however long it takes (a busy machine); one that makes no
// progress (it sleeps, logs nothing) is failed once the window passes,
// saying so.
func TestWaitStartingFollowsProgress(t *testing.T) {
	defer func(d time.Duration) { controllerStartStall = d }(controllerStartStall)
	controllerStartStall = 300 * time.Millisecond
	dir := t.TempDir()
	log, ready := filepath.Join(dir, "log"), filepath.Join(dir, "ready")
	watch := func(cmd *exec.Cmd) func() *helperexec.StallWatch {
		w := helperexec.NewStallWatch(cmd.Process.Pid, controllerStartStall, func() int64 {
			fi, err := os.Stat(log)
			if err != nil {
				return 0
			}
			return fi.Size()
		}, "controller")
		return func() *helperexec.StallWatch { return w }
	}
	exists := func(p string) func() bool {
		return func() bool { _, err := os.Stat(p); return err == nil }
	}

	// Slow: 40 lines 50 ms apart (2 s, many stall windows), then ready.
	slow := exec.Command("sh", "-c", `for i in $(seq 40); do echo starting >> "$1"; sleep 0.05; done; touch "$2"`, "sh", log, ready)
	if err := slow.Start(); err != nil {
		t.Fatal(err)
	}
	defer slow.Wait()
	if err := waitStarting(context.Background(), watch(slow), exists(ready)); err != nil {
		t.Fatalf("a controller that kept moving was failed: %v", err)
	}

	// Stuck: no CPU, no line; never ready.
	stuck := exec.Command("sleep", "60")
	if err := stuck.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stuck.Process.Kill(); stuck.Wait() }()
	err := waitStarting(context.Background(), watch(stuck), exists(filepath.Join(dir, "never")))
	if err == nil || !strings.Contains(err.Error(), "controller made no progress") {
		t.Fatalf("a stuck controller: %v", err)
	}
}
