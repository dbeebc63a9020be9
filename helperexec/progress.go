package helperexec

import (
	"fmt"
	"time"
)

// DefaultStallTimeout is how long a process of ours that starts (a
// helper, a link reaper) may make no progress before it counts as stuck:
// the helpers' default, for the controller's and `vmnetctl run`'s alike.
const DefaultStallTimeout = 15 * time.Second

// progress is how far a starting helper has got, as readProgress sees it.
type progress struct {
	ticks uint64 // CPU time of the helper and its descendants
	busy  bool   // one of them is runnable or waiting in the kernel
	state string // the helper's own state (R, S, D, ...)
	wchan string // where it sleeps, if the kernel says
}

// stallWatch tells a helper that is getting somewhere, however slowly,
// from one that is stuck: one that used no CPU, had nothing runnable and
// logged nothing for the whole stall window. On a busy machine a helper
// waits for a CPU (runnable) or for the kernel: it is slow, not stuck, and
// is not failed for it.
type stallWatch struct {
	pid     int
	stall   time.Duration
	logSize func() int64 // the helper's log's size, or nil
	what    string       // what it is, for the error: "helper"

	last    progress
	logged  int64
	movedAt time.Time
}

func newStallWatch(pid int, stall time.Duration, logSize func() int64) *stallWatch {
	w := &stallWatch{pid: pid, stall: stall, logSize: logSize, what: "helper", movedAt: time.Now()}
	w.last, _ = readProgress(pid)
	if logSize != nil {
		w.logged = logSize()
	}
	return w
}

// check returns an error saying why, once the helper has made no progress
// for the stall window; nil while it moves or the window has not passed.
func (w *stallWatch) check(now time.Time) error {
	p, ok := readProgress(w.pid)
	moved := ok && (p.ticks != w.last.ticks || p.busy)
	if w.logSize != nil {
		if n := w.logSize(); n != w.logged {
			w.logged, moved = n, true
		}
	}
	if moved {
		w.last, w.movedAt = p, now
		return nil
	}
	if now.Sub(w.movedAt) < w.stall {
		return nil
	}
	if !ok {
		return fmt.Errorf("%s not ready after %v", w.what, w.stall)
	}
	where := ""
	if p.wchan != "" && p.wchan != "0" {
		where = " in " + p.wchan
	}
	return fmt.Errorf("%s made no progress for %v (state %s%s: it used no CPU, ran nothing and logged nothing) and is not ready", w.what, w.stall, p.state, where)
}

// StallWatch tells a process of ours that is starting, however slowly
// on a busy machine, from one that is stuck, as Start does for a helper:
// stuck is no CPU used, nothing runnable and nothing logged (logSize, if
// not nil) for the whole stall window. what names it in the error.
type StallWatch struct{ w *stallWatch }

// NewStallWatch watches process pid from now.
func NewStallWatch(pid int, stall time.Duration, logSize func() int64, what string) *StallWatch {
	w := newStallWatch(pid, stall, logSize)
	w.what = what
	return &StallWatch{w}
}

// Check returns why, once the process has made no progress for the stall
// window; nil while it moves or the window has not passed.
func (s *StallWatch) Check(now time.Time) error { return s.w.check(now) }
