package relay

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// These tests need no root: a SOCK_DGRAM socketpair stands in for the TAP
// (read and write move one frame each, as on a TAP).

type relayEnds struct {
	r        *relay
	tapPeer  int // the "network" side of the fake TAP
	vmPeer   int // the VM's end of the socket
	done     chan error
	stopOnce bool
}

func startTestRelay(t testing.TB, frame int, setup ...func(*relay)) *relayEnds {
	t.Helper()
	pair := func() [2]int {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, fd := range fds {
			unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 1<<20)
		}
		t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
		return [2]int{fds[0], fds[1]}
	}
	tap, sock := pair(), pair()
	// The relay's ends are non-blocking, as in the helper. The test's ends
	// block on reads for at most 5 s, so that a lost frame fails the test
	// instead of hanging it; set here, once, not per frame.
	for _, fd := range []int{tap[0], sock[0]} {
		unix.SetNonblock(fd, true)
	}
	for _, fd := range []int{tap[1], sock[1]} {
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 5}); err != nil {
			t.Fatal(err)
		}
	}
	stop, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(stop) })
	e := &relayEnds{
		r:       &relay{tap: tap[0], sock: sock[0], stop: stop, frame: frame, host: &counters{}, vm: &counters{}, log: &Logger{w: &bytes.Buffer{}}},
		tapPeer: tap[1], vmPeer: sock[1], done: make(chan error, 1),
	}
	e.r.stream.conn, e.r.stream.done = -1, -1
	for _, f := range setup {
		f(e.r)
	}
	go func() { e.done <- e.r.run(nil) }()
	t.Cleanup(func() { e.stop(t) })
	return e
}

func (e *relayEnds) stop(t testing.TB) {
	if e.stopOnce {
		return
	}
	e.stopOnce = true
	signal(e.r.stop)
	select {
	case err := <-e.done:
		if err != nil {
			t.Errorf("relay: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("relay did not stop within 5s")
	}
}

// recvFrame reads one frame from a test end (tapPeer or vmPeer), which
// gives up after startTestRelay's 5 s receive timeout.
func recvFrame(t testing.TB, fd int, buf []byte) int {
	t.Helper()
	for {
		n, err := unix.Read(fd, buf)
		if err == unix.EINTR {
			// A signal (the Go runtime's preemption) interrupts a read with
			// a receive timeout; the kernel does not restart it.
			continue
		}
		if err != nil {
			t.Fatalf("reading a relayed frame: %v", err)
		}
		return n
	}
}

func TestRelayBothWays(t *testing.T) {
	e := startTestRelay(t, 1514)
	frame := bytes.Repeat([]byte{0xab}, 1514)
	buf := make([]byte, 2000)
	for i := range 100 {
		frame[0] = byte(i)
		unix.Write(e.tapPeer, frame)
		if n := recvFrame(t, e.vmPeer, buf); n != len(frame) || buf[0] != byte(i) {
			t.Fatalf("host→vm frame %d: %d bytes, first %d", i, n, buf[0])
		}
		unix.Write(e.vmPeer, frame[:60])
		if n := recvFrame(t, e.tapPeer, buf); n != 60 || buf[0] != byte(i) {
			t.Fatalf("vm→host frame %d: %d bytes", i, n)
		}
	}
	// Too short to be a frame, and too long for the network: dropped.
	unix.Write(e.vmPeer, frame[:10])
	unix.Write(e.vmPeer, append(frame, 1, 2, 3))
	unix.Write(e.vmPeer, frame[:64])
	if n := recvFrame(t, e.tapPeer, buf); n != 64 {
		t.Fatalf("got a %d byte frame, want the 64 byte one after two drops", n)
	}
	e.stop(t)
	host, vm := e.r.host.snapshot(), e.r.vm.snapshot()
	if host.Packets != 100 || host.Bytes != 151400 || vm.Packets != 101 || vm.Drops != 2 {
		t.Errorf("host %+v vm %+v", host, vm)
	}
}

// TestRelayStalledPeer: a VM that does not read costs drops, not a hang.
func TestRelayStalledPeer(t *testing.T) {
	e := startTestRelay(t, 1514)
	frame := make([]byte, 1514)
	for range 5000 {
		unix.Write(e.tapPeer, frame)
	}
	testutil.Eventually(t, 5*time.Second, func() error {
		if e.r.host.drops.Load() == 0 {
			return fmt.Errorf("no drops: %+v", e.r.host.snapshot())
		}
		return nil
	}, "drops with a stalled VM")
	// The other direction still works while this one is stalled.
	unix.Write(e.vmPeer, frame[:100])
	buf := make([]byte, 2000)
	if n := recvFrame(t, e.tapPeer, buf); n != 100 {
		t.Fatalf("vm→host while host→vm is stalled: %d bytes", n)
	}
	start := time.Now()
	e.stop(t)
	if d := time.Since(start); d > time.Second {
		t.Errorf("stopping took %v", d)
	}
}

func TestRelayPeerGone(t *testing.T) {
	e := startTestRelay(t, 1514)
	unix.Close(e.vmPeer)
	unix.Write(e.tapPeer, make([]byte, 100))
	select {
	case err := <-e.done:
		e.stopOnce = true
		if !errors.Is(err, errPeerGone) {
			t.Errorf("relay ended with %v, want errPeerGone", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("relay did not notice the VM was gone")
	}
}

// TestRelayAllocations: moving frames allocates nothing.
func TestRelayAllocations(t *testing.T) {
	e := startTestRelay(t, 1514)
	frame := make([]byte, 1514)
	buf := make([]byte, 2000)
	move := func(n int) {
		for range n {
			unix.Write(e.tapPeer, frame)
			recvFrame(t, e.vmPeer, buf)
			unix.Write(e.vmPeer, frame)
			recvFrame(t, e.tapPeer, buf)
		}
	}
	move(100) // warm up
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	move(2000)
	runtime.ReadMemStats(&after)
	// The test's own reads and the runtime may allocate a little; per frame
	// it must be nothing.
	if n := after.Mallocs - before.Mallocs; n > 200 {
		t.Errorf("%d allocations for 4000 frames", n)
	}
}

// BenchmarkRelay moves 1514-byte frames from the "TAP" to the VM in bursts
// of 32, as a TCP sender would: an op is one frame written to the TAP, moved
// by the relay and read by the VM. The sockets, their options and the
// buffers are set up before the timer starts; the loop makes only the
// writes and reads that a frame costs. Every frame must be relayed (none
// dropped): otherwise the benchmark measured something else.
func BenchmarkRelay(b *testing.B) {
	e := startTestRelay(b, 1514)
	frame := make([]byte, 1514)
	buf := make([]byte, 2000)
	b.SetBytes(1514)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += 32 {
		k := min(32, b.N-i)
		for range k {
			if _, err := unix.Write(e.tapPeer, frame); err != nil {
				b.Fatal(err)
			}
		}
		for range k {
			if n := recvFrame(b, e.vmPeer, buf); n != len(frame) {
				b.Fatalf("relayed a %d-byte frame, want %d", n, len(frame))
			}
		}
	}
	b.StopTimer()
	e.stop(b)
	if s := e.r.host.snapshot(); s.Packets != uint64(b.N) || s.Drops != 0 {
		b.Fatalf("the relay counted %+v for %d frames", s, b.N)
	}
}

// BenchmarkSocketpairCopy is the floor under a relay's socket side: one
// thread sends a 64 KiB datagram through a socketpair and reads it back,
// two copies with a warm cache (docs/performance.md compares it with what a
// copy costs the helpers under load).
func BenchmarkSocketpairCopy(b *testing.B) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	out, in := make([]byte, 64<<10), make([]byte, 64<<10)
	b.SetBytes(int64(len(out)))
	for b.Loop() {
		if _, err := unix.Write(fds[0], out); err != nil {
			b.Fatal(err)
		}
		if n, err := unix.Read(fds[1], in); err != nil || n != len(out) {
			b.Fatalf("read %d bytes: %v", n, err)
		}
	}
}
