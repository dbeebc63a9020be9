package vhostuser

import (
	"encoding/binary"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/relay"
)

// shaping is a backend's shaped link (Config.Shaped, Backend.Shape): its
// two delay lines (relay.DelayLine, as the relay's), and the frames the
// line to the guest let go, each behind its virtio-net header, for the
// data loop to put into the guest's RX chains when it can.
type shaping struct {
	toVM, fromVM *relay.DelayLine
	mu           sync.Mutex
	ready        [][]byte
	readyBytes   int
	pending      atomic.Int32 // len(ready), for the loop to look at without the lock
	wake         int          // an eventfd: ready has frames
}

// What waits at most for the guest's RX buffers, as a line holds at most:
// 1000 frames and 16 MiB; the rest are dropped.
const (
	readyFrames = 1000
	readyBytes  = 16 << 20
)

func newShaping(b *Backend) (*shaping, error) {
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, err
	}
	sh := &shaping{wake: wake}
	// (Frames are counted as they go into a line; those it drops, or the
	// port refuses, as drops too.)
	sh.toVM = relay.NewDelayLine(sh.letGo, func(n uint64) { b.Stats.Dropped.Add(n) })
	sh.fromVM = relay.NewDelayLine(func(f []byte) bool {
		_, err := unix.Write(b.cfg.Port, f)
		return err == nil
	}, func(n uint64) { b.Stats.FromVMRefused.Add(n) })
	return sh, nil
}

// letGo is the line to the guest's send: the data loop takes it from
// ready (takeReady).
func (sh *shaping) letGo(f []byte) bool {
	sh.mu.Lock()
	if len(sh.ready) >= readyFrames || sh.readyBytes+len(f) > readyBytes {
		sh.mu.Unlock()
		return false
	}
	sh.ready = append(sh.ready, f)
	sh.readyBytes += len(f)
	sh.pending.Store(int32(len(sh.ready)))
	first := len(sh.ready) == 1
	sh.mu.Unlock()
	if first {
		unix.Write(sh.wake, u64(1))
	}
	return true
}

// takeReady returns the first frame let go, or nil.
func (sh *shaping) takeReady() []byte {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if len(sh.ready) == 0 {
		return nil
	}
	f := sh.ready[0]
	sh.ready[0] = nil
	sh.ready = sh.ready[1:]
	sh.readyBytes -= len(f)
	sh.pending.Store(int32(len(sh.ready)))
	return f
}

// giveBack puts f back first, for the guest's next buffers.
func (sh *shaping) giveBack(f []byte) {
	sh.mu.Lock()
	sh.ready = append([][]byte{f}, sh.ready...)
	sh.readyBytes += len(f)
	sh.pending.Store(int32(len(sh.ready)))
	sh.mu.Unlock()
}

func (sh *shaping) close() {
	sh.toVM.Close()
	sh.fromVM.Close()
	unix.Close(sh.wake)
}

// Shape makes s the link's shaping from now on, for a backend made with
// Config.Shaped (else it does nothing).
func (b *Backend) Shape(s helperproto.Shapings) {
	if b.sh != nil {
		b.sh.toVM.Set(s.ToVM)
		b.sh.fromVM.Set(s.FromVM)
	}
}

// Close stops the backend's delay lines (Config.Shaped), once Serve
// returned.
func (b *Backend) Close() {
	if b.sh != nil {
		b.sh.close()
	}
}

// toVMShaped is toVM while the line to the guest is active: it reads
// what the port has (up to a batch) and puts each of the guest's frames
// into the line, behind the header the guest will get (segmenting for a
// guest without TSO, as toVMSegmenting); the frames the line lets go go
// into the RX chains by deliverShaped.
func (l *dataLoop) toVMShaped() (more bool, err error) {
	l.buffers()
	for range maxBatch {
		in := l.in
		if !l.b.cfg.VnetHdr {
			in = l.in[NetHeaderSize:] // (the header written below)
		}
		got, err := unix.Read(l.b.cfg.Port, in)
		if err == unix.EAGAIN || err == unix.EINTR || got == 0 && err == nil {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if got == len(in) {
			l.b.Stats.Dropped.Add(1)
			continue
		}
		if !l.b.cfg.VnetHdr {
			l.push(l.in[:NetHeaderSize+got], true)
			continue
		}
		if !l.segment {
			l.push(l.in[:got], false)
			continue
		}
		if l.seg.Reset(l.in[:got], len(l.frame)-NetHeaderSize) != nil {
			l.b.Stats.Dropped.Add(1)
			continue
		}
		for l.seg.More() {
			n := l.seg.Next(l.frame[NetHeaderSize:])
			l.push(l.frame[:NetHeaderSize+n], true)
		}
	}
	return true, nil
}

// push puts a frame behind its header into the line to the guest, the
// header zeroed first if zero (no offloads), its num_buffers one, and
// counts it (as the relay counts what goes into its lines).
func (l *dataLoop) push(f []byte, zero bool) {
	if zero {
		clear(f[:NetHeaderSize])
	}
	binary.LittleEndian.PutUint16(f[10:], 1)
	if !l.b.sh.toVM.Push(f) {
		l.b.Stats.Dropped.Add(1)
		return
	}
	l.b.Stats.ToVMFrames.Add(1)
	l.b.Stats.ToVMBytes.Add(uint64(len(f) - NetHeaderSize))
}

// deliverShaped puts the frames the line let go into the guest's RX
// chains, until none is left (waits false) or the ring has no chain
// (waits true: the rest wait for the guest's kick).
func (l *dataLoop) deliverShaped(c *chain) (waits bool, err error) {
	q := &l.rx.ring
	used := l.used(l.rx)
	defer used.done()
	for {
		f := l.b.sh.takeReady()
		if f == nil {
			return false, nil
		}
		if l.segment && (f[0] != 0 || f[1] != 0) {
			// Made for a guest with offloads, before its VMM reset the
			// device and the guest took none: not for this one.
			l.b.Stats.Dropped.Add(1)
			continue
		}
		ok, err := l.rxChain(c)
		if err != nil || !ok {
			l.b.sh.giveBack(f)
			return err == nil, err
		}
		if uint64(len(f)) > c.writeLen {
			q.lastAvail-- // (the chain serves the next frame)
			l.b.Stats.Dropped.Add(1)
			continue
		}
		scatter(c.written, f)
		used.put(c.head, uint32(len(f)))
	}
}
