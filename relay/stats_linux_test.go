package relay

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestQuietStats: a helper's stats line comes every interval while its
// counters move, and only every heartbeatIntervals intervals while they
// do not (at most that many lines in a window, never more: a busy machine
// only makes fewer); a frame after a quiet spell wakes the logger, and its
// counters are logged.
func TestQuietStats(t *testing.T) {
	const interval = 5 * time.Millisecond
	var packets atomic.Uint64
	var mu sync.Mutex
	var lines []uint64
	q := &quietStats{wake: make(chan struct{}, 1)}
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		q.run(interval, done, func() (helperproto.Counters, helperproto.Counters) {
			return helperproto.Counters{Packets: packets.Load()}, helperproto.Counters{}
		}, func(host, _ helperproto.Counters) {
			mu.Lock()
			defer mu.Unlock()
			lines = append(lines, host.Packets)
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
	before, began := count(), time.Now()
	window := 60 * interval
	time.Sleep(window) // a measurement window, not a wait for anything
	took := time.Since(began)
	if got, most := count()-before, int(took/(heartbeatIntervals*interval))+1; got > most {
		t.Errorf("%d stats lines in %v of idle, want at most %d (a heartbeat every %d intervals)", got, took, most, heartbeatIntervals)
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
}

var errNotYet = errorString("not yet")

type errorString string

func (e errorString) Error() string { return string(e) }
