package controller

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/vmnetctl/vmnetctl/statedir"
)

// TestChangeProjects: a change of the projects' API waits for the state
// dir's ops lock (an up, down or run of the CLI holds it) and gives up
// when its client leaves, leaving the lock and its turn to the next; a
// loop that found no project stays while a change is under way, and
// looks again when it ends; once it exits, changes are refused.
func TestChangeProjects(t *testing.T) {
	sd := statedir.Dir{Path: filepath.Join(t.TempDir(), "state")}
	if err := sd.Init(); err != nil {
		t.Fatal(err)
	}
	c, err := New(Options{StateDir: sd, Log: slog.New(slog.DiscardHandler), MetricsAddr: "off"})
	if err != nil {
		t.Fatal(err)
	}
	cli, err := sd.LockOps()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	res := make(chan error, 1)
	go func() {
		done, err := c.changeProjects(ctx)
		if done != nil {
			done()
		}
		res <- err
	}()
	cancel()
	if err := <-res; !errors.Is(err, context.Canceled) {
		t.Fatalf("a change whose client left while the CLI held the lock: %v, want context.Canceled", err)
	}
	cli.Unlock()
	// The one that gave up let go of its turn and of the lock.
	done, err := c.changeProjects(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sd.TryLockOps(); !errors.Is(err, statedir.ErrLocked) {
		t.Errorf("a change under way does not hold the ops lock: %v", err)
	}
	if c.exitIfIdle() {
		t.Error("the loop would exit with a change under way")
	}
	select {
	case <-c.kickc:
	default:
	}
	done()
	select {
	case <-c.kickc:
	default:
		t.Error("the loop was not woken to look again when the change ended")
	}
	l, err := sd.TryLockOps()
	if err != nil {
		t.Fatalf("the ops lock after the change: %v", err)
	}
	l.Unlock()
	if !c.exitIfIdle() {
		t.Error("the loop would not exit with no change under way")
	}
	if _, err := c.changeProjects(context.Background()); !errors.Is(err, errExiting) {
		t.Errorf("a change to an exiting controller: %v, want errExiting", err)
	}
}
