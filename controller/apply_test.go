package controller

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/statedir"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestChangeProjects: a change of the projects' API waits for the state
// dir's ops lock (an up, down or run of the CLI holds it) and gives up
// when its client leaves, leaving the lock and its turn to the next; it
// keeps the loop from exiting only once it holds the lock (a `down` of
// the last project holds it while it waits for the controller to exit),
// and is refused once the loop exits; a loop that found no project stays
// while a change is under way, and looks again when it ends.
func TestChangeProjects(t *testing.T) {
	sd := statedir.Dir{Path: filepath.Join(t.TempDir(), "state")}
	if err := sd.Init(); err != nil {
		t.Fatal(err)
	}
	newController := func() *Controller {
		c, err := New(Options{StateDir: sd, Log: slog.New(slog.DiscardHandler), MetricsAddr: "off"})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c := newController()
	cli, err := sd.LockOps()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	res := make(chan error, 1)
	change := func(ctx context.Context) {
		done, err := c.changeProjects(ctx)
		if done != nil {
			done()
		}
		res <- err
	}
	go change(ctx)
	cancel()
	if err := <-res; !errors.Is(err, context.Canceled) {
		t.Fatalf("a change whose client left while the CLI held the lock: %v, want context.Canceled", err)
	}
	// A change that waits for the lock does not keep an idle loop; once
	// the loop exits, it is refused when it gets the lock.
	go change(context.Background())
	testutil.Eventually(t, time.Minute, func() bool { return len(c.changing) == 1 }, "the change to wait for the ops lock")
	if !c.exitIfIdle() {
		t.Error("a change waiting for the ops lock kept the loop from exiting")
	}
	cli.Unlock()
	if err := <-res; !errors.Is(err, errExiting) {
		t.Errorf("a change to an exiting controller: %v, want errExiting", err)
	}

	// The ones that gave up or were refused let go of their turn and of
	// the lock.
	c = newController()
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
}
