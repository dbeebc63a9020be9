package relay

import (
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestQuietStats: a helper's stats line comes every interval while its
// counters move, and only every heartbeatIntervals intervals while they
// do not (a heartbeat), and never while they never moved; a frame after a
// quiet spell wakes the logger, and its counters are logged. Garbage collection is off while it sleeps (Go's
// runtime would wake an idle helper every two minutes to collect), and
// back once a frame woke it.
func TestQuietStats(t *testing.T) {
	const interval = 5 * time.Millisecond
	gcPercent := func() int { p := debug.SetGCPercent(-1); debug.SetGCPercent(p); return p }
	awake := gcPercent()
	var packets, snaps atomic.Uint64
	var gcAtFrame atomic.Int64 // GOGC as the line after the frame goes out
	var mu sync.Mutex
	var lines []uint64
	q := &quietStats{wake: make(chan struct{}, 1)}
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		q.run(interval, done, func() (helperproto.Counters, helperproto.Counters) {
			snaps.Add(1)
			return helperproto.Counters{Packets: packets.Load()}, helperproto.Counters{}
		}, func(host, _ helperproto.Counters) {
			mu.Lock()
			defer mu.Unlock()
			lines = append(lines, host.Packets)
			if host.Packets == 7 {
				gcAtFrame.Store(int64(gcPercent()))
			}
		})
	}()
	defer func() { close(done); <-ended }()
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(lines)
	}

	// Idle: asleep after the first interval; over a window of 60
	// intervals, at most one heartbeat line per heartbeatIntervals.
	testutil.Eventually(t, 10*time.Second, func() error {
		if !q.asleep.Load() {
			return errNotYet
		}
		return nil
	}, "the idle logger to sleep")
	if p := gcPercent(); p != -1 {
		t.Errorf("GOGC while asleep = %d, want -1 (off)", p)
	}
	before, snapsBefore, began := count(), snaps.Load(), time.Now()
	window := 2 * heartbeatIntervals * interval // two heartbeats' time
	time.Sleep(window)                          // a measurement window, not a wait for anything
	took := time.Since(began)
	most := int(took/(heartbeatIntervals*interval)) + 1
	// (Its counters never moved: no heartbeat at all.)
	if got := count() - before; got > 0 {
		t.Errorf("%d stats lines in %v of idle with counters that never moved, want none", got, took)
	}
	// One wake-up a heartbeat, one look at the counters each: none
	// an interval after a heartbeat.
	if got := int(snaps.Load() - snapsBefore); got > most {
		t.Errorf("the counters looked at %d times in %v of idle, want at most %d (once a heartbeat)", got, took, most)
	}

	// A frame wakes it: the new counters are logged.
	packets.Add(7)
	q.moved()
	testutil.Eventually(t, 10*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(lines) == 0 || lines[len(lines)-1] != 7 {
			return errNotYet
		}
		return nil
	}, "the counters after a frame to be logged")
	if p := gcAtFrame.Load(); p != int64(awake) {
		t.Errorf("GOGC when the frame's line was logged = %d, want %d as before the sleep", p, awake)
	}
	// Quiet again, once its counters moved: a heartbeat line, the same
	// counters, every heartbeatIntervals intervals.
	after := count()
	testutil.Eventually(t, 10*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(lines) <= after || lines[len(lines)-1] != 7 {
			return errNotYet
		}
		return nil
	}, "a heartbeat line once the counters moved and stopped")
}

var errNotYet = errorString("not yet")

type errorString string

func (e errorString) Error() string { return string(e) }

// TestStatsOut: without a file every stats line goes to the log; with one
// (--stats-file) the file holds the latest line, and the log gets the
// first, then one a minute at most, and the last.
func TestStatsOut(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	at := func(s int, packets uint64) helperproto.Stats {
		return helperproto.Stats{Time: t0.Add(time.Duration(s) * time.Second), VM: helperproto.Counters{Packets: packets}}
	}
	logged := func(b *strings.Builder) int { return strings.Count(b.String(), "[stats]") }

	var plain strings.Builder
	o := &StatsOut{Log: NewLogger(&plain, false, false)}
	for i := range 5 {
		o.Emit(at(5*i, uint64(i)), false)
	}
	if n := logged(&plain); n != 5 {
		t.Errorf("without a file: %d stats lines logged, want 5", n)
	}

	var log strings.Builder
	f, err := os.Create(filepath.Join(t.TempDir(), "a.stats"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	o = &StatsOut{Log: NewLogger(&log, false, false), File: f}
	for i := range 25 { // two minutes, every 5 s
		o.Emit(at(5*i, uint64(1000000+i)), false)
		if s, ok := helperproto.ReadStatsFile(f.Name()); !ok || s.VM.Packets != uint64(1000000+i) {
			b, _ := os.ReadFile(f.Name())
			t.Fatalf("the stats file after line %d: %q", i, b)
		}
	}
	if n := logged(&log); n != 3 {
		t.Errorf("with a file, two minutes every 5 s: %d stats lines logged, want 3 (at 0, 60 and 120 s)", n)
	}
	o.Emit(at(121, 7), true)
	if n := logged(&log); n != 4 {
		t.Errorf("the last line was not logged: %d", n)
	}
	if b, _ := os.ReadFile(f.Name()); !strings.HasSuffix(string(b), "}\n") || strings.Count(string(b), "\n") != 1 {
		t.Errorf("a shorter line left the longer one's end in the file: %q", b)
	}
}
