package vhostuser

import (
	"encoding/binary"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// frontend is the tests' Frontend: its failures fail the test.
type frontend struct {
	*Frontend
	t testing.TB
	q [numQueues]*guestRing
}

// guestRing is one of its rings, as the tests drive it.
type guestRing struct {
	*feRing
	f *frontend
}

// connect makes a frontend and sets the backend up on socket path.
func connect(t testing.TB, path string) *frontend {
	t.Helper()
	fe, err := Dial(path, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fe.Close)
	f := &frontend{Frontend: fe, t: t}
	for q := range numQueues {
		f.q[q] = &guestRing{feRing: fe.rings[q], f: f}
	}
	return f
}

func (f *frontend) close() { f.Close() }

// send writes a message with fds.
func (f *frontend) send(r Request, payload []byte, fds []int) {
	f.t.Helper()
	if err := f.Send(r, payload, fds); err != nil {
		f.t.Fatal(err)
	}
}

// mustTake is a free descriptor.
func (r *guestRing) mustTake() uint16 {
	d, ok := r.take()
	if !ok {
		r.f.t.Fatal("the guest's ring is full")
	}
	return d
}

// waitUsed waits (polling its call eventfd, with a deadline) until the
// backend used n more chains, and returns them.
func (r *guestRing) waitUsed(n int) []UsedEntry {
	r.f.t.Helper()
	var out []UsedEntry
	deadline := time.Now().Add(time.Minute)
	for {
		out = r.usedNow(out)
		if len(out) >= n {
			return out
		}
		if time.Now().After(deadline) {
			r.f.t.Fatalf("ring %d: %d of %d chains used within a minute", r.idx, len(out), n)
		}
		pfd := []unix.PollFd{{Fd: int32(r.call), Events: unix.POLLIN}}
		unix.Poll(pfd, 100)
		drainEventfd(r.call)
	}
}

// sendFrame puts frame on the ring, header and frame in two descriptors,
// and returns the chain's head (offered with offer).
func (r *guestRing) sendFrame(frame []byte) uint16 {
	h, d := r.mustTake(), r.mustTake()
	hdrAt, frameAt := r.bufOff(h), r.bufOff(d)
	clear(r.mem[hdrAt : hdrAt+NetHeaderSize])
	copy(r.mem[frameAt:], frame)
	r.putDesc(h, feGuestBase+hdrAt, NetHeaderSize, descFNext, d)
	r.putDesc(d, feGuestBase+frameAt, uint32(len(frame)), 0, 0)
	r.inflight[h] = []uint16{h, d}
	return h
}

// frame is a test frame of size bytes, numbered i.
func frame(i, size int) []byte {
	f := make([]byte, size)
	copy(f, []byte{0x52, 0x55, 0x55, 0, 0, 1, 0x52, 0x55, 0x55, 0, 0, 2, 0x08, 0x00})
	binary.BigEndian.PutUint32(f[14:], uint32(i))
	for j := 18; j < size; j++ {
		f[j] = byte(i + j)
	}
	return f
}
