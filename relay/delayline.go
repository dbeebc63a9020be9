package relay

import (
	"container/heap"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmnetctl/vmnetctl/helperproto"
)

// A DelayLine is one direction of a shaped link (helperproto.Shaping):
// the frames pushed into it are copied and held until they are due, then
// handed to send, in the order they fall due, by the line's own
// goroutine. An idle line (the zero Shaping) holds nothing and costs its
// caller one atomic load a frame: Active is false, and the caller sends
// as before. Its callers count a frame as it goes into the line, once
// (a duplicate is the line's, not the VM's or the network's); a frame
// the line cannot hold, or that send refuses, as a drop too.
type DelayLine struct {
	send    func([]byte) bool // false: the frame was dropped
	dropped func(n uint64)
	active  atomic.Bool

	mu    sync.Mutex
	s     helperproto.Shaping
	q     dueFrames
	seq   uint64
	bytes int
	rnd   *rand.Rand
	wake  chan struct{}
	done  chan struct{}
	ended chan struct{}
}

// What a line holds at most: netem's default limit of 1000 packets, and
// 16 MiB; a frame past either is dropped (and counted).
const (
	delayLineFrames = 1000
	delayLineBytes  = 16 << 20
)

// NewDelayLine starts an idle line that sends with send and counts with
// dropped what it drops (frames over its bounds, or that send refused).
func NewDelayLine(send func([]byte) bool, dropped func(n uint64)) *DelayLine {
	l := &DelayLine{send: send, dropped: dropped, rnd: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
		wake: make(chan struct{}, 1), done: make(chan struct{}), ended: make(chan struct{})}
	go l.run()
	return l
}

// Set makes s the line's shaping from now on. Frames held keep the time
// they were given; with the zero Shaping the line takes no more (Active
// is false) and sends those it holds when they fall due.
func (l *DelayLine) Set(s helperproto.Shaping) {
	l.mu.Lock()
	l.s = s
	l.active.Store(!s.Zero())
	l.mu.Unlock()
}

// Active says whether frames go through the line (Push) rather than
// straight to the peer.
func (l *DelayLine) Active() bool { return l != nil && l.active.Load() }

// Push copies frame into the line, twice if it is drawn for duplication,
// each copy due after the delay (give or take the jitter) or, drawn for
// reordering, at once. It returns false, and holds nothing, when the line
// is full.
func (l *DelayLine) Push(frame []byte) bool {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	copies := 1
	if l.draw(l.s.Duplicate) {
		copies = 2
	}
	if len(l.q)+copies > delayLineFrames || l.bytes+copies*len(frame) > delayLineBytes {
		return false
	}
	first := len(l.q) == 0
	for range copies {
		due := now
		if !l.draw(l.s.Reorder) {
			d := l.s.Delay
			if j := int64(l.s.Jitter); j > 0 {
				d += time.Duration(l.rnd.Int64N(2*j+1) - j)
			}
			due = now.Add(d)
		}
		l.seq++
		f := dueFrame{due: due, seq: l.seq, frame: append([]byte(nil), frame...)}
		if !first && f.before(l.q[0]) {
			first = true
		}
		heap.Push(&l.q, f)
		l.bytes += len(frame)
	}
	if first {
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
	return true
}

// draw is true for share (out of ShapingScale) of its calls, at random.
func (l *DelayLine) draw(share uint32) bool {
	return share > 0 && (share >= helperproto.ShapingScale || l.rnd.Uint32N(helperproto.ShapingScale) < share)
}

// Close stops the line; what it holds is dropped, uncounted.
func (l *DelayLine) Close() {
	close(l.done)
	<-l.ended
}

// run sends each frame when it falls due.
func (l *DelayLine) run() {
	defer close(l.ended)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		l.mu.Lock()
		if len(l.q) == 0 {
			l.mu.Unlock()
			select {
			case <-l.wake:
				continue
			case <-l.done:
				return
			}
		}
		if wait := time.Until(l.q[0].due); wait > 0 {
			l.mu.Unlock()
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-l.wake:
				timer.Stop()
			case <-l.done:
				return
			}
			continue
		}
		f := heap.Pop(&l.q).(dueFrame)
		l.bytes -= len(f.frame)
		l.mu.Unlock()
		if !l.send(f.frame) {
			l.dropped(1)
		}
	}
}

// dueFrame is a frame a line holds: due then, and pushed seq'th (frames
// due at once keep the order they came in).
type dueFrame struct {
	due   time.Time
	seq   uint64
	frame []byte
}

func (a dueFrame) before(b dueFrame) bool {
	if !a.due.Equal(b.due) {
		return a.due.Before(b.due)
	}
	return a.seq < b.seq
}

// dueFrames is a heap of frames, the first due first.
type dueFrames []dueFrame

func (h dueFrames) Len() int           { return len(h) }
func (h dueFrames) Less(i, j int) bool { return h[i].before(h[j]) }
func (h dueFrames) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *dueFrames) Push(x any)        { *h = append(*h, x.(dueFrame)) }
func (h *dueFrames) Pop() any {
	old := *h
	f := old[len(old)-1]
	old[len(old)-1] = dueFrame{}
	*h = old[:len(old)-1]
	return f
}
