package vhostuser

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/checksum"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// lab is a backend serving on a socket, its port one end of a
// SOCK_SEQPACKET pair: the test holds the other, as the TAP's kernel side.
type lab struct {
	b    *Backend
	path string
	port int // the test's end
	logs *testutil.Buffer
	done chan error
}

func newLab(t *testing.T, change ...func(*Config)) *lab {
	t.Helper()
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	l := &lab{path: filepath.Join(t.TempDir(), "vhost.sock"), port: pair[1], logs: &testutil.Buffer{}, done: make(chan error, 1)}
	cfg := Config{Port: pair[0], Logf: func(format string, args ...any) { fmt.Fprintf(l.logs, format+"\n", args...) }}
	for _, f := range change {
		f(&cfg)
	}
	l.b = New(cfg)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: l.path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { l.done <- l.b.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-l.done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		unix.Close(pair[0])
		unix.Close(pair[1])
	})
	return l
}

// readPort reads a frame the backend wrote to the port, with a deadline.
func (l *lab) readPort(t *testing.T) []byte {
	t.Helper()
	if !readable(l.port) {
		t.Fatal("no frame on the port within a minute")
	}
	b := make([]byte, 65536)
	n, err := unix.Read(l.port, b)
	if err != nil {
		t.Fatal(err)
	}
	return b[:n]
}

// TestFramesBothWays: frames the guest puts on its TX ring come out of
// the port as they were, without the virtio-net header, and the chains
// come back used; frames written to the port land in the guest's RX
// buffers after a header that says one buffer, with the used lengths,
// and the guest is interrupted.
func TestFramesBothWays(t *testing.T) {
	l := newLab(t)
	f := connect(t, l.path)
	tx, rx := f.q[txQueue], f.q[rxQueue]
	sizes := []int{60, 64, 100, 1000, 1514, 1500, 42}
	for round := range 3 {
		var heads []uint16
		for i, size := range sizes {
			heads = append(heads, tx.sendFrame(frame(round*100+i, size)))
		}
		tx.offer(heads...)
		for i, size := range sizes {
			if got := l.readPort(t); !bytes.Equal(got, frame(round*100+i, size)) {
				t.Fatalf("round %d, frame %d from the guest: %d bytes, not as sent (%d)", round, i, len(got), size)
			}
		}
		tx.release(tx.waitUsed(len(sizes)))
	}
	rx.postRX(16)
	for i, size := range sizes {
		if _, err := unix.Write(l.port, frame(500+i, size)); err != nil {
			t.Fatal(err)
		}
	}
	used := rx.waitUsed(len(sizes))
	for i, u := range used {
		if int(u.Len) != NetHeaderSize+sizes[i] {
			t.Errorf("RX %d: used length %d, want %d", i, u.Len, NetHeaderSize+sizes[i])
			continue
		}
		buf := f.mem[f.q[rxQueue].bufOff(u.Head):]
		if n := binary.LittleEndian.Uint16(buf[10:]); n != 1 || !bytes.Equal(buf[:10], make([]byte, 10)) {
			t.Errorf("RX %d: header %x, want zeros and one buffer", i, buf[:NetHeaderSize])
		}
		if got := buf[NetHeaderSize : NetHeaderSize+sizes[i]]; !bytes.Equal(got, frame(500+i, sizes[i])) {
			t.Errorf("RX %d: the frame is not as written", i)
		}
	}
	if s := &l.b.Stats; s.FromVMFrames.Load() != uint64(3*len(sizes)) || s.ToVMFrames.Load() != uint64(len(sizes)) {
		t.Errorf("stats: %d frames from the VM, %d to it", s.FromVMFrames.Load(), s.ToVMFrames.Load())
	}
}

// TestRXWaitsForBuffers: frames that come while the guest has no RX
// buffers wait in the port, and land once it posts some.
func TestRXWaitsForBuffers(t *testing.T) {
	l := newLab(t)
	f := connect(t, l.path)
	rx := f.q[rxQueue]
	for i := range 4 {
		if _, err := unix.Write(l.port, frame(i, 100)); err != nil {
			t.Fatal(err)
		}
	}
	rx.postRX(4)
	for i, u := range rx.waitUsed(4) {
		if got := f.mem[f.q[rxQueue].bufOff(u.Head)+NetHeaderSize:][:100]; !bytes.Equal(got, frame(i, 100)) {
			t.Errorf("frame %d not as written", i)
		}
	}
}

// TestVMMRestarts: a VMM that goes ends its session; the next one on the
// socket (a restarted VMM) sets everything up again and moves frames.
func TestVMMRestarts(t *testing.T) {
	l := newLab(t)
	for i := range 3 {
		f := connect(t, l.path)
		tx := f.q[txQueue]
		tx.offer(tx.sendFrame(frame(i, 200)))
		if got := l.readPort(t); !bytes.Equal(got, frame(i, 200)) {
			t.Fatalf("VMM %d: the frame is not as sent", i)
		}
		tx.waitUsed(1)
		f.close()
	}
	deadline := time.Now().Add(time.Minute)
	for l.b.Stats.Sessions.Load() != 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := l.b.Stats.Sessions.Load(); n != 3 {
		t.Errorf("%d sessions, want 3", n)
	}
}

// TestHostileRings: what a guest (or its VMM) can write wrong ends the
// session with a line that says what, never reads or writes outside the
// shared memory, and the backend serves the next VMM.
func TestHostileRings(t *testing.T) {
	for _, c := range []struct {
		name, want string
		spoil      func(f *frontend, r *guestRing) uint16
	}{
		{"a buffer outside the guest's memory", "not in the guest's memory", func(f *frontend, r *guestRing) uint16 {
			h := r.mustTake()
			r.putDesc(h, feGuestBase+f.memSize()-10, 100, 0, 0)
			return h
		}},
		{"a buffer below the guest's memory", "not in the guest's memory", func(f *frontend, r *guestRing) uint16 {
			h := r.mustTake()
			r.putDesc(h, 0x1000, 100, 0, 0)
			return h
		}},
		{"a length that wraps", "not in the guest's memory", func(f *frontend, r *guestRing) uint16 {
			h := r.mustTake()
			r.putDesc(h, feGuestBase+0x1000, 0xffffffff, 0, 0)
			return h
		}},
		{"a chain that loops", "loops", func(f *frontend, r *guestRing) uint16 {
			a, b := r.mustTake(), r.mustTake()
			r.putDesc(a, feGuestBase+r.bufOff(a), 100, descFNext, b)
			r.putDesc(b, feGuestBase+r.bufOff(b), 100, descFNext, a)
			return a
		}},
		{"a next past the table", "next is", func(f *frontend, r *guestRing) uint16 {
			a := r.mustTake()
			r.putDesc(a, feGuestBase+r.bufOff(a), 100, descFNext, feRingNum+5)
			return a
		}},
		{"an indirect table, not offered", "indirect", func(f *frontend, r *guestRing) uint16 {
			a := r.mustTake()
			r.putDesc(a, feGuestBase+r.bufOff(a), 64, descFIndirect, 0)
			return a
		}},
		{"a head past the table", "head descriptor", func(f *frontend, r *guestRing) uint16 {
			return feRingNum + 1
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := newLab(t)
			f := connect(t, l.path)
			tx := f.q[txQueue]
			tx.offer(c.spoil(f, tx))
			deadline := time.Now().Add(time.Minute)
			for !strings.Contains(l.logs.String(), c.want) {
				if time.Now().After(deadline) {
					t.Fatalf("no log line with %q within a minute: %s", c.want, l.logs.String())
				}
				time.Sleep(10 * time.Millisecond)
			}
			// The session ended: the VMM's socket reads EOF.
			f.conn.SetReadDeadline(time.Now().Add(time.Minute))
			if n, err := f.conn.Read(make([]byte, 1)); n != 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
				t.Errorf("the VMM's socket after a broken ring: %d bytes, %v; want EOF", n, err)
			}
			// Still serving: a good VMM comes after.
			f.close()
			g := connect(t, l.path)
			g.q[txQueue].offer(g.q[txQueue].sendFrame(frame(1, 100)))
			if got := l.readPort(t); !bytes.Equal(got, frame(1, 100)) {
				t.Fatal("the next VMM's frame is not as sent")
			}
		})
	}
}

// TestBadMessages: a memory table of too many regions, a ring too large,
// features not offered and a request not known end the session with an
// error that names them.
func TestBadMessages(t *testing.T) {
	for _, c := range []struct {
		name, want string
		send       func(f *frontend)
	}{
		{"features not offered", "not offered", func(f *frontend) { f.send(SetFeatures, u64(1<<5), nil) }},
		{"a ring of 3", "a ring of 3 entries", func(f *frontend) {
			f.send(SetVringNum, VringState{Index: 0, Num: 3}.encode(), nil)
		}},
		{"ring 7", "ring 7", func(f *frontend) { f.send(SetVringNum, VringState{Index: 7, Num: 256}.encode(), nil) }},
		{"nine regions", "9 regions", func(f *frontend) {
			f.send(SetMemTable, encodeMemTable(make([]Region, 9)), nil)
		}},
		{"a region without its descriptor", "1 regions with 0 descriptors", func(f *frontend) {
			f.send(SetMemTable, encodeMemTable([]Region{{GuestAddr: 0, Size: 4096, UserAddr: 0}}), nil)
		}},
		{"an unknown request", "not supported", func(f *frontend) { f.send(Request(99), nil, nil) }},
		{"a payload too large", "bytes and", func(f *frontend) { f.send(SetOwner, make([]byte, MaxPayload+1), nil) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := newLab(t)
			f := connect(t, l.path)
			c.send(f)
			deadline := time.Now().Add(time.Minute)
			for !strings.Contains(l.logs.String(), c.want) {
				if time.Now().After(deadline) {
					t.Fatalf("no log line with %q within a minute: %s", c.want, l.logs.String())
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// relayToNIC connects a stand-in VMM (Frontend, with gro) to lab l and
// runs its Relay on a NIC that is one end of a packet socket pair: the
// test's end is returned. All of it ends with the test.
func relayToNIC(t *testing.T, l *lab, gro bool) int {
	t.Helper()
	fe, err := Dial(l.path, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fe.Close)
	fe.GRO = gro
	nic, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(nic[0]); unix.Close(nic[1]) })
	go fe.Relay(nic[0])
	return nic[1]
}

// TestFrontendRelay: the stand-in VMM's Relay carries frames between a
// NIC (here a packet socket's end) and the rings both ways, as the
// benchmark uses it: what the NIC sends comes out of the backend's port,
// and what the port gets reaches the NIC, more frames than a ring holds.
func TestFrontendRelay(t *testing.T) {
	l := newLab(t)
	nic := relayToNIC(t, l, false)
	read := func(fd int) []byte {
		t.Helper()
		if !readable(fd) {
			t.Fatal("no frame within a minute")
		}
		b := make([]byte, 4096)
		n, err := unix.Read(fd, b)
		if err != nil {
			t.Fatal(err)
		}
		return b[:n]
	}
	for i := range 3 * feRingNum {
		size := 60 + i%1455
		if _, err := unix.Write(nic, frame(i, size)); err != nil {
			t.Fatal(err)
		}
		if got := read(l.port); !bytes.Equal(got, frame(i, size)) {
			t.Fatalf("frame %d from the NIC: %d bytes, not as sent (%d)", i, len(got), size)
		}
		if _, err := unix.Write(l.port, frame(i+1, size)); err != nil {
			t.Fatal(err)
		}
		if got := read(nic); !bytes.Equal(got, frame(i+1, size)) {
			t.Fatalf("frame %d to the NIC: %d bytes, not as sent (%d)", i, len(got), size)
		}
	}
}

// TestOffloads: with a port whose frames carry the virtio-net header,
// the backend offers checksum offload and TSO both ways, tells the port
// what the guest takes, and passes the header through as it is both ways
// (a 64 KiB segment too), only num_buffers set to one towards the guest.
func TestOffloads(t *testing.T) {
	var told []bool
	l := newLab(t, func(c *Config) {
		c.VnetHdr = true
		c.SetOffloads = func(csum, tso4, tso6 bool) error { told = []bool{csum, tso4, tso6}; return nil }
	})
	fe, err := Dial(l.path, true)
	if err != nil {
		t.Fatal(err)
	}
	defer fe.Close()
	if !fe.Offloads() || !slices.Equal(told, []bool{true, true, true}) {
		t.Fatalf("offloads %v, the port told %v", fe.Offloads(), told)
	}
	f := &frontend{Frontend: fe, t: t}
	for q := range numQueues {
		f.q[q] = &guestRing{feRing: fe.rings[q], f: f}
	}
	// A header as a guest with TSO writes it: NEEDS_CSUM, TCPv4, the
	// headers' length, the MSS, where the checksum starts and goes.
	hdr := []byte{1, 1, 54, 0, 0xa8, 0x05, 34, 0, 16, 0, 0, 0}
	tx := f.q[txQueue]
	for _, size := range []int{60, 1514, 65000} {
		d := tx.mustTake()
		at := tx.bufOff(d)
		copy(f.mem[at:], hdr)
		copy(f.mem[at+NetHeaderSize:], frame(size, size))
		tx.putDesc(d, feGuestBase+at, uint32(NetHeaderSize+size), 0, 0)
		tx.inflight[d] = []uint16{d}
		tx.offer(d)
		if got, want := l.readPort(t), append(slices.Clone(hdr), frame(size, size)...); !bytes.Equal(got, want) {
			t.Fatalf("a %d-byte frame from the guest: %d bytes on the port, not its header and frame as sent", size, len(got))
		}
		tx.release(tx.waitUsed(1))
	}
	rx := f.q[rxQueue]
	rx.postRX(4)
	in := append(slices.Clone(hdr[:10]), 0xee, 0xee) // num_buffers as the port leaves it
	if _, err := unix.Write(l.port, append(in, frame(7, 65000)...)); err != nil {
		t.Fatal(err)
	}
	u := rx.waitUsed(1)[0]
	got := f.mem[rx.bufOff(u.Head):][:u.Len]
	if want := append(append(slices.Clone(hdr[:10]), 1, 0), frame(7, 65000)...); !bytes.Equal(got, want) {
		t.Errorf("a 65000-byte segment to the guest: header %x, %d bytes; want %x and the frame", got[:NetHeaderSize], len(got), want[:NetHeaderSize])
	}
}

// TestVMMDiesMidMessage: a VMM that goes halfway through a header, or
// through a payload, ends its session; the next VMM is served.
func TestVMMDiesMidMessage(t *testing.T) {
	l := newLab(t)
	for _, partial := range [][]byte{
		Header{Request: GetFeatures, Flags: flagVersion}.encode()[:5],
		append(Header{Request: SetVringNum, Flags: flagVersion, Size: 8}.encode(), 1, 2, 3),
	} {
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: l.path, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		c.Write(partial)
		c.Close()
	}
	f := connect(t, l.path)
	f.q[txQueue].offer(f.q[txQueue].sendFrame(frame(9, 100)))
	if got := l.readPort(t); !bytes.Equal(got, frame(9, 100)) {
		t.Fatal("the VMM after two that died mid-message: its frame is not as sent")
	}
	if n := l.b.Stats.Sessions.Load(); n != 3 {
		t.Errorf("%d sessions, want 3", n)
	}
}

// TestGuestHeaders: the port gets the guest's virtio-net header only as
// far as the guest negotiated it: a guest without offloads whose header
// asks for a checksum, or one with them asking for UDP segmentation or
// ECN, has the frame refused and counted; a zero header passes, as zero.
func TestGuestHeaders(t *testing.T) {
	for _, c := range []struct {
		name     string
		offloads bool
		hdr      []byte
		pass     bool
	}{
		{"no offloads, a zero header", false, make([]byte, NetHeaderSize), true},
		{"no offloads, NEEDS_CSUM", false, []byte{1, 0, 0, 0, 0, 0, 34, 0, 16, 0, 0, 0}, false},
		{"offloads, TSO over TCPv6", true, []byte{1, 4, 74, 0, 0xa0, 0x05, 54, 0, 16, 0, 0, 0}, true},
		{"offloads, UDP segmentation", true, []byte{1, 5, 42, 0, 0xa0, 0x05, 34, 0, 6, 0, 0, 0}, false},
		{"offloads, TSO with ECN", true, []byte{1, 0x81, 54, 0, 0xa8, 0x05, 34, 0, 16, 0, 0, 0}, false},
		{"offloads, TSO without NEEDS_CSUM", true, []byte{0, 1, 54, 0, 0xa8, 0x05, 34, 0, 16, 0, 0, 0}, false},
		{"offloads, DATA_VALID", true, []byte{2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := newLab(t, func(cfg *Config) { cfg.VnetHdr = true })
			fe, err := Dial(l.path, c.offloads)
			if err != nil {
				t.Fatal(err)
			}
			defer fe.Close()
			f := &frontend{Frontend: fe, t: t}
			tx := &guestRing{feRing: fe.rings[txQueue], f: f}
			for i, hdr := range [][]byte{c.hdr, make([]byte, NetHeaderSize)} {
				d := tx.mustTake()
				at := tx.bufOff(d)
				copy(f.mem[at:], hdr)
				copy(f.mem[at+NetHeaderSize:], frame(i, 100))
				tx.putDesc(d, feGuestBase+at, NetHeaderSize+100, 0, 0)
				tx.inflight[d] = []uint16{d}
				tx.offer(d)
			}
			tx.release(tx.waitUsed(2))
			got := l.readPort(t)
			want := append(make([]byte, NetHeaderSize), frame(1, 100)...) // the zero header's frame
			if c.pass {
				want = append(slices.Clone(c.hdr), frame(0, 100)...)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("the port got %x..., want %x...", got[:16], want[:16])
			}
			if refused := l.b.Stats.FromVMRefused.Load(); refused != map[bool]uint64{true: 0, false: 1}[c.pass] {
				t.Errorf("%d frames refused", refused)
			}
		})
	}
}

// readable waits, up to a minute, until fd has something to read (a
// signal, such as the runtime's preemption, only interrupts the wait).
func readable(fd int) bool {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(pfd, int(time.Until(deadline)/time.Millisecond)+1)
		if err == unix.EINTR {
			continue
		}
		return n > 0
	}
	return false
}

// waitLog waits, up to a minute, for a line of the backend's log with s.
func (l *lab) waitLog(t *testing.T, s string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(l.logs.String(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("no log line with %q within a minute: %s", s, l.logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestVMMCutsItsMemory: a VMM that cuts the file of the guest's memory
// under the helper's mapping makes its next read fault: the session
// ends with a line saying so, the helper lives on, and the next VMM is
// served.
func TestVMMCutsItsMemory(t *testing.T) {
	l := newLab(t)
	f := connect(t, l.path)
	tx := f.q[txQueue]
	h := tx.sendFrame(frame(1, 100))
	binary.LittleEndian.PutUint16(f.mem[tx.avail+4:], h)
	store16(f.mem[tx.avail+2:], 1)
	if err := unix.Ftruncate(f.memFD, 0); err != nil {
		t.Fatal(err)
	}
	unix.Write(tx.kick, u64(1))
	l.waitLog(t, "a fault at")
	g := connect(t, l.path)
	g.q[txQueue].offer(g.q[txQueue].sendFrame(frame(2, 100)))
	if got := l.readPort(t); !bytes.Equal(got, frame(2, 100)) {
		t.Fatal("the next VMM's frame is not as sent")
	}
}

// TestKickNotEventfd: a kick that is no eventfd (a pipe, which polls
// readable for ever once its writer goes) ends the session.
func TestKickNotEventfd(t *testing.T) {
	l := newLab(t)
	f := connect(t, l.path)
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	unix.Close(p[1])
	f.send(SetVringKick, u64(txQueue), []int{p[0]})
	l.waitLog(t, "no eventfd")
}

// TestDrainNeverWaits: draining an empty eventfd that its VMM made
// blocking returns at once.
func TestDrainNeverWaits(t *testing.T) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC) // (blocking)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	done := make(chan struct{})
	go func() { drainEventfd(fd); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		unix.Write(fd, u64(1)) // (let the goroutine go)
		t.Fatal("draining an empty blocking eventfd waited")
	}
	unix.Write(fd, u64(3))
	drainEventfd(fd)
	if n, _ := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0); n != 0 {
		t.Error("the count is still there after a drain")
	}
}

// TestMemTableUnderRunningRings: a memory table sent again while the
// rings run (memory hotplug) leaves them where they were: the guest's
// next frame is the next the port sees, not its first again.
func TestMemTableUnderRunningRings(t *testing.T) {
	l := newLab(t)
	f := connect(t, l.path)
	tx := f.q[txQueue]
	for i := range 3 {
		tx.offer(tx.sendFrame(frame(i, 100)))
		if got := l.readPort(t); !bytes.Equal(got, frame(i, 100)) {
			t.Fatalf("frame %d not as sent", i)
		}
	}
	tx.release(tx.waitUsed(3))
	if err := f.Ack(SetMemTable, encodeMemTable([]Region{{GuestAddr: feGuestBase, Size: f.memSize(), UserAddr: feUserBase}}), []int{f.memFD}); err != nil {
		t.Fatal(err)
	}
	tx.offer(tx.sendFrame(frame(3, 100)))
	if got := l.readPort(t); !bytes.Equal(got, frame(3, 100)) {
		t.Fatalf("after the new table the port got %d bytes, not the next frame (a rewound ring sends the first again)", len(got))
	}
}

// TestRXFrameTooLarge: a frame larger than the guest's buffer is lost
// and counted, never reported as written past the buffer; the buffer
// takes the next frame that fits. The port is a real TAP (in a namespace
// of the test's), whose read says a frame's whole length when it cut it.
func TestRXFrameTooLarge(t *testing.T) {
	testutil.RequireRoot(t, "makes a TAP in a network namespace")
	ns := testutil.NewNS(t, "vutap")
	tap := -1
	ns.MustDo(t, func() (err error) {
		tap, err = testutil.OpenTAP("vu0")
		return err
	})
	defer unix.Close(tap)
	// Without IPv6 the link says nothing of its own when it comes up (an
	// MLD report would take the one buffer offered).
	ns.MustDo(t, func() error {
		err := os.WriteFile("/proc/sys/net/ipv6/conf/vu0/disable_ipv6", []byte("1"), 0)
		if errors.Is(err, os.ErrNotExist) { // booted with ipv6.disable=1
			return nil
		}
		return err
	})
	ns.MustRun(t, "ip", "link", "set", "vu0", "up")
	l := newLab(t, func(c *Config) { c.Port = tap })
	f := connect(t, l.path)
	rx := f.q[rxQueue]
	d := rx.mustTake()
	rx.putDesc(d, feGuestBase+rx.bufOff(d), NetHeaderSize+100, descFWrite, 0)
	rx.inflight[d] = []uint16{d}
	rx.offer(d)
	// The frames, sent out of the TAP's link: the TAP's reader gets them.
	ns.MustDo(t, func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		link, err := net.InterfaceByName("vu0")
		if err != nil {
			return err
		}
		to := &unix.SockaddrLinklayer{Ifindex: link.Index, Halen: 6}
		for _, fr := range [][]byte{frame(1, 1000), frame(2, 60)} {
			if err := unix.Sendto(fd, fr, 0, to); err != nil {
				return err
			}
		}
		return nil
	})
	u := rx.waitUsed(1)[0]
	if u.Len != NetHeaderSize+60 || !bytes.Equal(f.mem[rx.bufOff(u.Head)+NetHeaderSize:][:60], frame(2, 60)) {
		t.Errorf("used %d bytes, want the 60-byte frame after its header", u.Len)
	}
	if n := l.b.Stats.Dropped.Load(); n != 1 {
		t.Errorf("%d frames dropped, want the one too large", n)
	}
}

// tcpSegment is an IPv4 TCP segment of one flow (ACK, no PSH, DF), the
// i'th of a run of mss-byte ones, with valid checksums.
func tcpSegment(i, mss int) []byte {
	payload := make([]byte, mss)
	for j := range payload {
		payload[j] = byte(i + j)
	}
	return tcpPacket(1+i*mss, 100+i, payload)
}

// tcpPacket is a segment of that flow: sequence number seq, IP ID id,
// valid checksums.
func tcpPacket(seq, id int, payload []byte) []byte {
	eth := []byte{2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00}
	tcp := make([]byte, 20, 20+len(payload))
	binary.BigEndian.PutUint16(tcp[0:], 1000)
	binary.BigEndian.PutUint16(tcp[2:], 2000)
	binary.BigEndian.PutUint32(tcp[4:], uint32(seq))
	binary.BigEndian.PutUint32(tcp[8:], 777)
	tcp[12], tcp[13] = 5<<4, 0x10
	binary.BigEndian.PutUint16(tcp[14:], 512)
	tcp = append(tcp, payload...)
	ip := []byte{0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 2, 10, 0, 0, 1}
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(tcp)))
	binary.BigEndian.PutUint16(ip[4:], uint16(id))
	binary.BigEndian.PutUint16(ip[10:], checksum.Of(ip))
	pseudo := append(append([]byte{}, ip[12:20]...), 0, 6, byte(len(tcp)>>8), byte(len(tcp)))
	binary.BigEndian.PutUint16(tcp[16:], checksum.Of(pseudo, tcp))
	return append(append(eth, ip...), tcp...)
}

// tsoPacket is payload as one TCP packet of tcpPacket's flow from
// sequence number 1, behind the virtio-net header a port gives it to be
// cut into segments of mss bytes, as the kernel leaves it for TSO: the
// TCP checksum field holds the pseudo-header's sum, the header says where
// it goes.
func tsoPacket(payload []byte, mss int) []byte {
	pkt := tcpPacket(1, 100, payload)
	tcp := pkt[34:]
	pseudo := append(append([]byte{}, pkt[26:34]...), 0, 6, byte(len(tcp)>>8), byte(len(tcp)))
	binary.BigEndian.PutUint16(tcp[16:], checksum.Fold(checksum.Add(0, pseudo)))
	hdr := []byte{hdrNeedsCSum, gsoTCPv4, 54, 0, byte(mss), byte(mss >> 8), 34, 0, 16, 0, 0, 0}
	return append(hdr, pkt...)
}

// TestSegmentedWithoutOffloads: for a guest without offloads, the port
// is told to hand over TSO packets all the same, and the backend cuts
// each into the guest's frames, with their checksums, behind headers
// that ask for nothing; a packet larger than the buffers the guest gave
// waits, half cut, for more, and goes on where it stopped.
func TestSegmentedWithoutOffloads(t *testing.T) {
	var told []bool
	l := newLab(t, func(c *Config) {
		c.VnetHdr = true
		c.SetOffloads = func(csum, tso4, tso6 bool) error { told = []bool{csum, tso4, tso6}; return nil }
	})
	f := connect(t, l.path)
	if f.Offloads() || !slices.Equal(told, []bool{true, true, true}) {
		t.Fatalf("guest offloads %v, the port told %v: want none, and checksums and TSO", f.Offloads(), told)
	}
	l.waitLog(t, "the guest takes no offloads (the port's TCP segments cut into its frames here)")
	const n, mss = 30, 1448
	payload := make([]byte, n*mss-100) // (the last segment short)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	if _, err := unix.Write(l.port, tsoPacket(payload, mss)); err != nil {
		t.Fatal(err)
	}
	rx := f.q[rxQueue]
	var frames [][]byte
	for _, post := range []int{10, n - 10} {
		rx.postRX(post)
		for _, u := range rx.waitUsed(post) {
			b := f.mem[rx.bufOff(u.Head):][:u.Len]
			if !bytes.Equal(b[:NetHeaderSize], []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0}) {
				t.Fatalf("frame %d's header %x: want none asked for, one buffer", len(frames), b[:NetHeaderSize])
			}
			frames = append(frames, slices.Clone(b[NetHeaderSize:]))
			rx.release([]UsedEntry{u})
		}
	}
	for i, got := range frames {
		want := tcpPacket(1+i*mss, 100+i, payload[i*mss:min((i+1)*mss, len(payload))])
		if !bytes.Equal(got, want) {
			t.Fatalf("frame %d: %d bytes, not segment %d as the sender would have cut it", i, len(got), i)
		}
	}
	if s := &l.b.Stats; s.ToVMFrames.Load() != n || s.Dropped.Load() != 0 {
		t.Errorf("stats: %d frames to the VM (want %d), %d dropped", s.ToVMFrames.Load(), n, s.Dropped.Load())
	}
}

// TestCoalescedWithoutOffloads: a guest without offloads, on a port that
// takes headers, has a run of its TCP segments written as one packet the
// header describes as TSO (relay.Coalescer), their bytes all in it; the
// stats count the guest's frames.
func TestCoalescedWithoutOffloads(t *testing.T) {
	l := newLab(t, func(c *Config) { c.VnetHdr = true })
	f := connect(t, l.path)
	tx := f.q[txQueue]
	const n, mss = 10, 1448
	var heads []uint16
	for i := range n {
		heads = append(heads, tx.sendFrame(tcpSegment(i, mss)))
	}
	tx.offer(heads...)
	got := l.readPort(t)
	if len(got) != NetHeaderSize+14+20+20+n*mss || got[0] != hdrNeedsCSum || got[1] != gsoTCPv4 || binary.LittleEndian.Uint16(got[4:]) != mss {
		t.Fatalf("the port got %d bytes behind header %x, want the %d segments as one TSO packet", len(got), got[:NetHeaderSize], n)
	}
	tx.waitUsed(n)
	if s := &l.b.Stats; s.FromVMFrames.Load() != n || s.FromVMBytes.Load() != n*(14+20+20+mss) {
		t.Errorf("stats: %d frames, %d bytes from the VM", s.FromVMFrames.Load(), s.FromVMBytes.Load())
	}
}

// TestSegmentingLargeFrames: for a guest without TSO, a frame from the
// port larger than its buffers (a jumbo network's) is dropped and
// counted, whole, and the next one reaches the guest as it was.
func TestSegmentingLargeFrames(t *testing.T) {
	l := newLab(t, func(c *Config) { c.VnetHdr = true })
	f := connect(t, l.path)
	rx := f.q[rxQueue]
	rx.postRX(4)
	for _, size := range []int{12000, 100} {
		if _, err := unix.Write(l.port, append(make([]byte, NetHeaderSize), frame(size, size)...)); err != nil {
			t.Fatal(err)
		}
	}
	u := rx.waitUsed(1)[0]
	if got := f.mem[rx.bufOff(u.Head):][:u.Len]; !bytes.Equal(got[NetHeaderSize:], frame(100, 100)) {
		t.Errorf("the guest got %d bytes, not the 100-byte frame after the large one", len(got))
	}
	if d := l.b.Stats.Dropped.Load(); d != 1 {
		t.Errorf("%d frames dropped, want the large one", d)
	}
}

// TestFrontendGRO: the stand-in VMM with GRO (a guest without offloads
// that merges what it receives, as the benchmark's guest does) hands its
// NIC the frames the backend cut from a port's TSO packet merged again
// behind headers that ask for TSO, every byte in order; and what the NIC
// sends behind its header reaches the port as a frame.
func TestFrontendGRO(t *testing.T) {
	l := newLab(t, func(c *Config) {
		c.VnetHdr = true
		c.SetOffloads = func(csum, tso4, tso6 bool) error { return nil }
	})
	nic := relayToNIC(t, l, true)

	const n, mss = 30, 1448
	payload := make([]byte, n*mss)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	if _, err := unix.Write(l.port, tsoPacket(payload, mss)); err != nil {
		t.Fatal(err)
	}
	var got []byte
	merged := 0
	b := make([]byte, 128<<10)
	for len(got) < len(payload) {
		if !readable(nic) {
			t.Fatalf("the NIC got %d of %d bytes within a minute", len(got), len(payload))
		}
		k, err := unix.Read(nic, b)
		if err != nil {
			t.Fatal(err)
		}
		p := b[:k]
		switch p[1] {
		case gsoTCPv4:
			merged++
			if binary.LittleEndian.Uint16(p[4:]) != mss {
				t.Fatalf("a merged packet's header %x: want its segment size %d", p[:NetHeaderSize], mss)
			}
		case 0:
			if len(p) < NetHeaderSize+54 || !bytes.Equal(p[:NetHeaderSize], make([]byte, NetHeaderSize)) || binary.BigEndian.Uint16(p[NetHeaderSize+12:]) != 0x0800 {
				t.Fatalf("the NIC got %d bytes that are no IPv4 frame behind an empty header: %x", len(p), p[:min(len(p), NetHeaderSize+14)])
			}
		default:
			t.Fatalf("a packet's header %x", p[:NetHeaderSize])
		}
		got = append(got, p[NetHeaderSize+54:]...)
	}
	if !bytes.Equal(got, payload) {
		t.Fatalf("the NIC got %d bytes, not the payload as sent", len(got))
	}
	if merged == 0 {
		t.Error("no run of segments reached the NIC merged")
	}

	// The NIC's frames, behind a header that asks for nothing, go out.
	f := frame(1, 200)
	if _, err := unix.Write(nic, append(make([]byte, NetHeaderSize), f...)); err != nil {
		t.Fatal(err)
	}
	if got := l.readPort(t); !bytes.Equal(got[NetHeaderSize:], f) {
		t.Errorf("the port got %d bytes, not the NIC's frame", len(got))
	}
}
