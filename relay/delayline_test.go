package relay

import (
	"encoding/binary"
	"sync"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/helperproto"
)

// lineSink records what a DelayLine sends, and when.
type lineSink struct {
	mu    sync.Mutex
	got   []uint32 // the frames' numbers, as sent
	at    []time.Time
	drops uint64
	more  chan struct{}
}

func newLineSink() *lineSink { return &lineSink{more: make(chan struct{}, 1)} }

func (s *lineSink) send(f []byte) bool {
	s.mu.Lock()
	s.got = append(s.got, binary.BigEndian.Uint32(f))
	s.at = append(s.at, time.Now())
	s.mu.Unlock()
	select {
	case s.more <- struct{}{}:
	default:
	}
	return true
}

// wait waits (a minute at most) for n frames and returns them.
func (s *lineSink) wait(t *testing.T, n int) ([]uint32, []time.Time) {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		s.mu.Lock()
		if len(s.got) >= n {
			defer s.mu.Unlock()
			return append([]uint32(nil), s.got...), append([]time.Time(nil), s.at...)
		}
		s.mu.Unlock()
		select {
		case <-s.more:
		case <-deadline:
			t.Fatalf("%d of %d frames sent within a minute", len(s.got), n)
		}
	}
}

func numbered(i int) []byte {
	f := make([]byte, 60)
	binary.BigEndian.PutUint32(f, uint32(i))
	return f
}

func newTestLine(t *testing.T, s helperproto.Shaping) (*DelayLine, *lineSink) {
	sink := newLineSink()
	l := NewDelayLine(sink.send, func(n uint64) { sink.mu.Lock(); sink.drops += n; sink.mu.Unlock() })
	t.Cleanup(l.Close)
	l.Set(s)
	return l, sink
}

// TestDelayLineDelays: each frame is sent no sooner than the delay after
// it was pushed, in the order pushed; the line copies what it holds.
func TestDelayLineDelays(t *testing.T) {
	const delay = 30 * time.Millisecond
	l, sink := newTestLine(t, helperproto.Shaping{Delay: delay})
	if !l.Active() {
		t.Fatal("a line with a delay is not active")
	}
	var pushed []time.Time
	buf := make([]byte, 60)
	for i := range 10 {
		copy(buf, numbered(i))
		pushed = append(pushed, time.Now())
		if !l.Push(buf) {
			t.Fatalf("frame %d refused", i)
		}
		clear(buf)
	}
	got, at := sink.wait(t, 10)
	for i := range got {
		if got[i] != uint32(i) {
			t.Fatalf("sent in the order %v", got)
		}
		if early := pushed[i].Add(delay).Sub(at[i]); early > 0 {
			t.Errorf("frame %d sent %v early", i, early)
		}
	}
	l.Set(helperproto.Shaping{})
	if l.Active() {
		t.Error("a line set to nothing is active")
	}
}

// TestDelayLineJitter: with jitter, frames pushed together are sent
// within delay ± jitter of their push, not all in order.
func TestDelayLineJitter(t *testing.T) {
	const delay, jitter = 40 * time.Millisecond, 20 * time.Millisecond
	l, sink := newTestLine(t, helperproto.Shaping{Delay: delay, Jitter: jitter})
	start := time.Now()
	for i := range 200 {
		l.Push(numbered(i))
	}
	got, at := sink.wait(t, 200)
	inversions := 0
	for i := range got {
		if i > 0 && got[i] < got[i-1] {
			inversions++
		}
		if at[i].Sub(start) < delay-jitter {
			t.Fatalf("frame %d sent after %v, before delay - jitter", got[i], at[i].Sub(start))
		}
	}
	if inversions == 0 {
		t.Error("200 jittered frames sent in the order pushed")
	}
}

// TestDelayLineDuplicatesAndReorders: duplicate 100% sends each frame
// twice, 50% about half of them twice; reorder 100% sends at once what
// the delay would hold an hour.
func TestDelayLineDuplicatesAndReorders(t *testing.T) {
	l, sink := newTestLine(t, helperproto.Shaping{Duplicate: 10000, Delay: time.Millisecond})
	for i := range 5 {
		l.Push(numbered(i))
	}
	if got, _ := sink.wait(t, 10); len(got) != 10 || got[0] != 0 || got[1] != 0 || got[9] != 4 {
		t.Errorf("duplicate 100%%: sent %v", got)
	}
	// 400 frames, each held twice at most: the line has room for all.
	l, sink = newTestLine(t, helperproto.Shaping{Duplicate: 5000, Delay: time.Microsecond})
	for i := range 400 {
		if !l.Push(numbered(i)) {
			t.Fatalf("frame %d refused", i)
		}
	}
	// Every frame is sent once or twice: wait until the last one is.
	for {
		if got, _ := sink.wait(t, 400); got[len(got)-1] == 399 {
			break
		}
		<-sink.more
	}
	sink.mu.Lock()
	n := len(sink.got)
	sink.mu.Unlock()
	if n < 400+150 || n > 400+250 { // (200 ± 5 standard deviations)
		t.Errorf("duplicate 50%%: %d frames sent for 400", n)
	}
	l, sink = newTestLine(t, helperproto.Shaping{Reorder: 10000, Delay: time.Hour})
	l.Push(numbered(1))
	if got, _ := sink.wait(t, 1); got[0] != 1 {
		t.Errorf("reorder 100%%: sent %v", got)
	}
}

// TestDelayLineBounded: a line holds at most 1000 frames, and 16 MiB:
// a guest that floods a delayed link with 64 KiB packets fills its own
// line, no more.
func TestDelayLineBounded(t *testing.T) {
	l, _ := newTestLine(t, helperproto.Shaping{Delay: time.Hour})
	for i := range delayLineFrames {
		if !l.Push(numbered(i)) {
			t.Fatalf("frame %d refused", i)
		}
	}
	if l.Push(numbered(0)) {
		t.Error("frame 1001 held")
	}
	l, _ = newTestLine(t, helperproto.Shaping{Delay: time.Hour})
	big := make([]byte, 64<<10)
	for i := range delayLineBytes / len(big) {
		if !l.Push(big) {
			t.Fatalf("64 KiB packet %d refused", i)
		}
	}
	if l.Push(big) {
		t.Errorf("a packet past %d bytes held", delayLineBytes)
	}
}
