package relay

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// The stream transport (Spec.Stream): what qemu's `-netdev stream` and
// socket_vmnet speak, and so lima's `socket:` networks on Linux. The VMM
// connects to the helper's socket; each frame, both ways, is a 4-byte
// big-endian length and then the frame, with no virtio-net header. One
// VMM is served at a time; when it goes (EOF), the helper waits for the
// next on the same path (a VMM started again), and its port's guard
// learns the new VMM's MAC, as with a datagram client that restarts.

// streamLenSize is the length prefix of each frame.
const streamLenSize = 4

// errBadLength: the VMM sent a length no frame has; its connection is
// closed.
var errBadLength = errors.New("a frame length out of bounds")

// serveStream accepts the VMMs on lis one after the other and relays
// their frames, until stop. Without lis, the VMM's connection was handed
// over (--fd): it is served until it goes, and the helper ends with it.
func serveStream(r *relay, lis *Listener, relearn func() error, log *Logger) error {
	if lis == nil {
		log.Infof("main", "forwarding started")
		useServingProcs()
		err := r.runStream(r.sock)
		switch {
		case errors.Is(err, errStopped):
			log.Infof("main", "stopping: terminated")
			return nil
		case errors.Is(err, errPeerGone), errors.Is(err, errBadLength):
			log.Infof("main", "stopping: client gone (%v)", err)
			return nil
		}
		return err
	}
	log.Infof("main", "waiting for client on %q", lis.path)
	for served := 0; ; served++ {
		conn, err := acceptStream(lis.fd, r.stop)
		if errors.Is(err, errStopped) {
			log.Infof("main", "stopping: terminated")
			return nil
		}
		if err != nil {
			return err
		}
		if served == 0 {
			log.Infof("main", "forwarding started")
			useServingProcs()
		} else if relearn != nil {
			// As followClient: the new VMM may pick a MAC of its own.
			if err := relearn(); err != nil {
				log.Warnf("main", "the port's guard keeps the MAC it learned: %v", err)
			}
		}
		log.Infof("main", "serving a client on %q", lis.path)
		err = r.runStream(conn)
		unix.Close(conn)
		switch {
		case errors.Is(err, errStopped):
			log.Infof("main", "stopping: terminated")
			return nil
		case errors.Is(err, errPeerGone), errors.Is(err, errBadLength):
			log.Infof("main", "client gone (%v): waiting for the next", err)
		case err != nil:
			return err
		}
	}
}

// acceptStream waits for a VMM's connection on the listening socket fd,
// or for stop.
func acceptStream(fd, stop int) (int, error) {
	w := newWaiter(fd, stop)
	for {
		conn, _, err := unix.Accept4(fd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		switch {
		case err == nil:
			return conn, nil
		case err == unix.EAGAIN || err == unix.EINTR || err == unix.ECONNABORTED:
			if err := w.wait(unix.POLLIN, -1); err != nil {
				return -1, err
			}
		default:
			return -1, fmt.Errorf("accepting a client: %w", err)
		}
	}
}

// runStream relays between the TAP and one VMM's connection conn until
// either ends: errStopped when the helper is told to stop, errPeerGone
// when the VMM went.
func (r *relay) runStream(conn int) error {
	done, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return fmt.Errorf("eventfd: %w", err)
	}
	defer unix.Close(done)
	r.stream.mu.Lock()
	r.stream.conn, r.stream.done = conn, done
	r.stream.mu.Unlock()
	defer func() {
		// The line sends to this VMM no more: its descriptors are closed
		// after this.
		r.stream.mu.Lock()
		r.stream.conn, r.stream.done = -1, -1
		r.stream.mu.Unlock()
	}()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, f := range []func(conn, done int) error{r.tapToStream, r.streamToTap} {
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			errs[i] = f(conn, done)
			signal(done) // whatever ended one direction ends the other
		})
	}
	wg.Wait()
	if stopped(r.stop) {
		return errStopped
	}
	for _, err := range errs {
		if err != nil && !errors.Is(err, errStopped) {
			return err
		}
	}
	return errPeerGone
}

// stopped tells whether the eventfd efd was signalled.
func stopped(efd int) bool {
	fds := []unix.PollFd{{Fd: int32(efd), Events: unix.POLLIN}}
	n, _ := unix.Poll(fds, 0)
	return n > 0
}

// tapToStream forwards what the network sends the VM ("host" counters):
// each frame read from the TAP is written with its length.
func (r *relay) tapToStream(conn, done int) error {
	buf := make([]byte, streamLenSize+r.frame)
	tapWait := newWaiter(r.tap, r.stop, done)
	connWait := newWaiter(conn, r.stop, done)
	for {
		n, err := ioWait(tapWait, unix.POLLIN, func() (int, error) { return unix.Read(r.tap, buf[streamLenSize:]) })
		switch {
		case errors.Is(err, errStopped):
			return err
		case err != nil:
			return fmt.Errorf("reading from the TAP: %w", err)
		case n < EthHeaderLen:
			continue
		}
		binary.BigEndian.PutUint32(buf, uint32(n))
		if r.toVM.Active() {
			if !r.toVM.Push(buf[:streamLenSize+n]) {
				r.host.drops.Add(1)
				r.moved()
				continue
			}
		} else {
			r.stream.mu.Lock() // (the line's sends may be under way)
			err := writeAll(conn, buf[:streamLenSize+n], connWait)
			r.stream.mu.Unlock()
			if err != nil {
				return err
			}
			r.host.syscall(1)
		}
		r.host.packets.Add(1)
		r.host.bytes.Add(uint64(n))
		r.moved()
	}
}

// writeAll writes b whole to the non-blocking stream conn, waiting for
// room (a frame is never cut: the VMM would lose its place in the stream).
func writeAll(conn int, b []byte, w *waiter) error {
	for len(b) > 0 {
		n, err := ioWait(w, unix.POLLOUT, func() (int, error) { return unix.Write(conn, b) })
		switch {
		case errors.Is(err, errStopped), errors.Is(err, errPeerGone):
			return err
		case err != nil:
			return fmt.Errorf("writing to the VM: %w", err)
		}
		b = b[n:]
	}
	return nil
}

// ioWait runs op, a read or write of a non-blocking fd, until it does
// something: while the fd has nothing to give or no room (EAGAIN) it
// waits with w for events, and it tries again on EINTR. A peer that went
// is errPeerGone; a stop, errStopped.
func ioWait(w *waiter, events int16, op func() (int, error)) (int, error) {
	for {
		n, err := op()
		switch {
		case err == unix.EAGAIN:
			if err := w.wait(events, -1); err != nil {
				return 0, err
			}
		case err == unix.EINTR:
		case peerGone(err):
			return 0, errPeerGone
		default:
			return n, err
		}
	}
}

// streamToTap forwards what the VM sends ("vm" counters): the stream is
// read in large reads and cut into frames by their lengths; a length
// shorter than an Ethernet header or longer than a frame can be ends the
// connection (errBadLength), the frames before it delivered.
func (r *relay) streamToTap(conn, done int) error {
	buf := make([]byte, max(64<<10, 2*(streamLenSize+r.frame)))
	w := newWaiter(conn, r.stop, done)
	have := 0
	for {
		n, err := ioWait(w, unix.POLLIN, func() (int, error) { return unix.Read(conn, buf[have:]) })
		switch {
		case errors.Is(err, errStopped), errors.Is(err, errPeerGone):
			return err
		case err != nil:
			return fmt.Errorf("reading from the VM: %w", err)
		case n == 0:
			return errPeerGone // EOF: the VMM closed its end
		}
		have += n
		off := 0
		var packets, bytes, drops uint64
		for have-off >= streamLenSize {
			l := int(binary.BigEndian.Uint32(buf[off:]))
			if l < EthHeaderLen || l > r.frame {
				r.vm.packets.Add(packets)
				r.vm.bytes.Add(bytes)
				r.vm.drops.Add(drops + 1)
				return fmt.Errorf("%w: %d bytes", errBadLength, l)
			}
			if have-off < streamLenSize+l {
				break
			}
			if r.toTap(buf[off+streamLenSize : off+streamLenSize+l]) {
				packets++
				bytes += uint64(l)
			} else {
				drops++
			}
			off += streamLenSize + l
		}
		have = copy(buf, buf[off:have])
		r.vm.syscall(int(packets + drops))
		r.vm.packets.Add(packets)
		r.vm.bytes.Add(bytes)
		r.vm.drops.Add(drops)
		r.moved()
	}
}
