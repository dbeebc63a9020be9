package relay

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Relay tuning.
const (
	// BatchSize is how many frames one recvmmsg/sendmmsg moves at most.
	BatchSize = 64
	// sendWait bounds the wait for room in the VM's socket: a batch waits
	// up to this long in all for the VM to read, then its rest is dropped
	// and counted. A VM that reads, however slowly, loses nothing (a TCP
	// stream's sender slows down to what it reads); one that stops reading
	// costs the other flows queued behind it this long once, and then no
	// more: while it stays stalled (stalled), frames for it are dropped at
	// once until a send succeeds again. vmnet-helper v0.13 waits 10 × 50 µs
	// per batch, which drops frames of a single TCP stream to a VM that is
	// merely slower than the host (docs/performance.md).
	sendWait = 20 * time.Millisecond
	// minFirstDatagram: shorter first datagrams on --socket are hellos
	// (vfkit's "VFKT"), not frames.
	minFirstDatagram = 64
)

// errStopped ends the relay when the helper is told to stop.
var errStopped = errors.New("stopped")

// errPeerGone ends the relay when the VM's end of the socket is gone.
var errPeerGone = errors.New("the VM's end of the socket is gone")

// relay moves frames between a TAP and the VM's socket: two goroutines on
// their own OS threads, non-blocking fds, and ppoll (on the fd and the stop
// eventfd) only when a fd has nothing to give. Under load a direction never
// polls: it reads until EAGAIN and sends in batches.
type relay struct {
	tap, sock, stop int
	hdr             int // virtio-net header length, 0 without offloads
	// tapHdr is the virtio-net header of a TAP with offloads the VM has
	// not (hdr is 0): the relay merges what it writes (coalesce.go) and
	// cuts what it reads (gso.go). 0: the TAP's frames are the VM's.
	tapHdr   int
	frame    int // buffer size: hdr + max packet size
	host, vm *counters
	log      *Logger
	// stalled is set while the VM does not read (send); tapToSocket's only.
	stalled bool
	// quiet, once stats are logged, is woken as the counters move (moved).
	quiet atomic.Pointer[quietStats]
	// followPeer (--socket) keeps the relay going while the VM's socket is
	// gone: a VMM that exits is not the end, a restarted one on the same
	// path is followed (followClient). With --fd the VM's end going away
	// ends the helper.
	followPeer bool
	// toVM and fromVM shape the link, when Spec.ShapingFile says to
	// (delayline.go); nil or idle, frames go straight through.
	toVM, fromVM *DelayLine
	// stream is the stream VMM being served (stream_linux.go), for toVM's
	// sends; its mu also keeps each frame's write whole.
	stream struct {
		mu         sync.Mutex
		conn, done int // -1: none
	}
}

// run relays until stop is signalled or a direction fails. first, if not
// empty, is a frame received from the VM before the relay started.
func (r *relay) run(first []byte) error {
	if len(first) > 0 {
		if r.tapHdr > 0 {
			first = append(make([]byte, r.tapHdr, r.tapHdr+len(first)), first...)
		}
		r.writeTap(first)
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, f := range []func() error{r.tapToSocket, r.socketToTap} {
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			errs[i] = f()
			// Whatever ended one direction ends the other.
			signal(r.stop)
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil && !errors.Is(err, errStopped) {
			return err
		}
	}
	return nil
}

// signal makes an eventfd readable.
func signal(efd int) {
	var one = [8]byte{1}
	unix.Write(efd, one[:])
}

// waiter polls one fd together with the stop eventfds, without
// allocating once made.
type waiter struct {
	fds []unix.PollFd
	ts  unix.Timespec
}

func newWaiter(fd int, stops ...int) *waiter {
	w := &waiter{fds: []unix.PollFd{{Fd: int32(fd)}}}
	for _, s := range stops {
		w.fds = append(w.fds, unix.PollFd{Fd: int32(s), Events: unix.POLLIN})
	}
	return w
}

// wait returns when fd has events (or errors), after timeout (< 0: never),
// or with errStopped when stop is signalled.
func (w *waiter) wait(events int16, timeout time.Duration) error {
	w.fds[0].Events = events
	for i := range w.fds {
		w.fds[i].Revents = 0
	}
	tsp := (*unix.Timespec)(nil)
	if timeout >= 0 {
		w.ts = unix.NsecToTimespec(int64(timeout))
		tsp = &w.ts
	}
	for {
		_, err := unix.Ppoll(w.fds, tsp, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("ppoll: %w", err)
		}
		for _, s := range w.fds[1:] {
			if s.Revents != 0 {
				return errStopped
			}
		}
		return nil
	}
}

func peerGone(err error) bool {
	return err == unix.ECONNREFUSED || err == unix.ENOTCONN || err == unix.EPIPE || err == unix.ECONNRESET
}

// tapToSocket forwards what the network sends the VM ("host" counters):
// read frames from the TAP until it is empty or the batch is full, then
// sendmmsg them.
func (r *relay) tapToSocket() error {
	if r.tapHdr > 0 {
		return r.tapToSocketSegmenting()
	}
	b := newBatch(BatchSize, r.frame, 0)
	defer b.free()
	tapWait := newWaiter(r.tap, r.stop)
	sockWait := newWaiter(r.sock, r.stop)
	empty := false // the last read found the TAP empty: poll, don't read again
	for {
		if empty {
			if err := tapWait.wait(unix.POLLIN, -1); err != nil {
				return err
			}
			empty = false
		}
		n := 0
		for n < BatchSize {
			nr, err := unix.Read(r.tap, b.bufs[n])
			if err == unix.EAGAIN {
				empty = true
				break
			}
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return fmt.Errorf("reading from the TAP: %w", err)
			}
			if nr <= r.hdr {
				continue
			}
			b.iovs[n].SetLen(nr)
			n++
		}
		if n == 0 {
			continue
		}
		if err := r.deliver(b, n, sockWait); err != nil {
			return err
		}
	}
}

// tapToSocketSegmenting is tapToSocket for a TAP with host-side offloads:
// each packet read (up to 64 KiB with TSO) is cut into the VM's frames in
// the batch (Segmenter), which is sent when full or when the TAP is empty.
func (r *relay) tapToSocketSegmenting() error {
	b := newBatch(BatchSize, r.frame, 0)
	defer b.free()
	ib := newBatch(1, r.tapHdr+TapMaxPacket, 0) // mapped, as b
	defer ib.free()
	in := ib.bufs[0]
	tapWait := newWaiter(r.tap, r.stop)
	sockWait := newWaiter(r.sock, r.stop)
	var seg Segmenter
	n := 0
	for {
		nr, err := unix.Read(r.tap, in)
		switch {
		case err == unix.EAGAIN:
			if n > 0 {
				if err := r.deliver(b, n, sockWait); err != nil {
					return err
				}
				n = 0
			}
			if err := tapWait.wait(unix.POLLIN, -1); err != nil {
				return err
			}
			continue
		case err == unix.EINTR:
			continue
		case err != nil:
			return fmt.Errorf("reading from the TAP: %w", err)
		}
		if nr < r.tapHdr+EthHeaderLen {
			continue
		}
		// A read that filled the buffer may have been cut short (the
		// buffer holds the largest packet a TAP hands over, so never).
		if nr == len(in) || seg.Reset(in[:nr], r.frame) != nil {
			r.host.drops.Add(1)
			r.moved()
			continue
		}
		for seg.More() {
			if n == BatchSize {
				if err := r.deliver(b, n, sockWait); err != nil {
					return err
				}
				n = 0
			}
			b.iovs[n].SetLen(seg.Next(b.bufs[n]))
			n++
		}
	}
}

// deliver sends b's first n frames to the VM (send), or puts them into
// the shaped link's line when it is active (its sendToVM sends them).
func (r *relay) deliver(b *batch, n int, w *waiter) error {
	if !r.toVM.Active() {
		return r.send(b, n, w)
	}
	var packets, bytes, drops uint64
	for i := range n {
		if r.toVM.Push(b.bufs[i][:b.iovs[i].Len]) {
			packets++
			bytes += uint64(b.iovs[i].Len) - uint64(r.hdr)
		} else {
			drops++
		}
	}
	r.host.packets.Add(packets)
	r.host.bytes.Add(bytes)
	r.host.drops.Add(drops)
	r.moved()
	return nil
}

// sendToVM sends one frame to the VM, for the toVM line: on the datagram
// socket, or to the stream VMM being served; false if it could not.
func (r *relay) sendToVM(f []byte) bool {
	r.stream.mu.Lock()
	defer r.stream.mu.Unlock()
	if r.stream.conn >= 0 {
		return writeAll(r.stream.conn, f, newWaiter(r.stream.conn, r.stop, r.stream.done)) == nil
	}
	_, err := unix.Write(r.sock, f)
	return err == nil
}

// send sends b's first n frames to the VM with bounded back-pressure
// (sendWait).
func (r *relay) send(b *batch, n int, w *waiter) error {
	sent := 0
	var deadline time.Time
	for sent < n {
		k, err := sendmmsg(r.sock, b.msgs[sent:n], unix.MSG_DONTWAIT)
		if k > 0 {
			var bytes uint64
			for i := sent; i < sent+k; i++ {
				bytes += uint64(b.iovs[i].Len) - uint64(r.hdr)
			}
			r.host.packets.Add(uint64(k))
			r.host.bytes.Add(bytes)
			r.host.syscall(k)
			r.moved()
			sent += k
			r.stalled, deadline = false, time.Time{}
			continue
		}
		switch {
		case err == unix.EINTR:
		case err == unix.EAGAIN || err == unix.ENOBUFS:
			now := time.Now()
			if deadline.IsZero() {
				deadline = now.Add(sendWait)
			}
			if r.stalled || !now.Before(deadline) {
				// The VM does not read: drop the rest, and drop at once
				// until it reads again.
				r.stalled = true
				r.host.drops.Add(uint64(n - sent))
				r.moved()
				return nil
			}
			if err := w.wait(unix.POLLOUT, deadline.Sub(now)); err != nil {
				return err
			}
		case peerGone(err) && r.followPeer:
			// No VM to take them (it exited; a restarted one is
			// followed): not drops.
			return nil
		case peerGone(err):
			return errPeerGone
		case err == unix.EMSGSIZE:
			// Larger than the socket's send buffer allows: drop that frame.
			r.host.drops.Add(1)
			r.moved()
			sent++
		default:
			return fmt.Errorf("sending to the VM: %w", err)
		}
	}
	return nil
}

// socketToTap forwards what the VM sends ("vm" counters): recvmmsg a batch,
// then write each frame to the TAP (a TAP takes one frame per write).
func (r *relay) socketToTap() error {
	b := newBatch(BatchSize, r.frame, r.tapHdr)
	var c *Coalescer
	var frames [][]byte
	if r.tapHdr > 0 {
		c, frames = NewCoalescer(), make([][]byte, 0, BatchSize)
	}
	defer b.free()
	w := newWaiter(r.sock, r.stop)
	empty := false // the last batch was not full: the socket is likely empty
	for {
		if empty {
			if err := w.wait(unix.POLLIN, -1); err != nil {
				return err
			}
		}
		k, err := recvmmsg(r.sock, b.msgs, unix.MSG_DONTWAIT)
		switch {
		case err == unix.EAGAIN:
			empty = true
			continue
		case err == unix.EINTR:
			continue
		case peerGone(err) && r.followPeer:
			empty = true
			continue
		case peerGone(err):
			return errPeerGone
		case err != nil:
			return fmt.Errorf("receiving from the VM: %w", err)
		}
		empty = k < BatchSize
		r.vm.syscall(k)
		var packets, bytes, drops uint64
		frames = frames[:0]
		for i := range k {
			m := &b.msgs[i]
			l := int(m.Len)
			if m.Hdr.Flags&unix.MSG_TRUNC != 0 || l < r.hdr+EthHeaderLen {
				drops++
				continue
			}
			if c != nil {
				frames = append(frames, b.bufs[i][:r.tapHdr+l])
				continue
			}
			if r.toTap(b.bufs[i][:l]) {
				packets++
				bytes += uint64(l - r.hdr)
			} else {
				drops++
			}
		}
		if c != nil {
			p, n, d := c.Write(frames, r.toTap)
			packets, bytes, drops = packets+p, bytes+n, drops+d
		}
		r.vm.packets.Add(packets)
		r.vm.bytes.Add(bytes)
		r.vm.drops.Add(drops)
		r.moved()
	}
}

// toTap writes one frame from the VM to the TAP (writeTap), or puts it
// into the shaped link's line when it is active; false if it was dropped.
func (r *relay) toTap(frame []byte) bool {
	if r.fromVM.Active() {
		return r.fromVM.Push(frame)
	}
	return r.writeTap(frame)
}

// writeTap writes one frame; false if the kernel refused it (a malformed
// frame or virtio-net header, or no memory): that frame is dropped.
func (r *relay) writeTap(frame []byte) bool {
	for {
		_, err := unix.Write(r.tap, frame)
		if err == unix.EINTR {
			continue
		}
		return err == nil
	}
}

// moved tells the stats logger that the counters moved (quietStats).
func (r *relay) moved() {
	if q := r.quiet.Load(); q != nil {
		q.moved()
	}
}
