package relay

import (
	"bytes"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestUnboundClientsLogLimited: a local process that floods a helper's
// socket with datagrams from an unbound socket costs one log line, not one
// per datagram; the client that then binds its socket is served. The line
// written after the period counts those left out.
func TestUnboundClientsLogLimited(t *testing.T) {
	l, dir, stop := listenForTest(t)
	path := l.path
	var out bytes.Buffer
	log := &Logger{w: &out}
	type accepted struct {
		client string
		err    error
	}
	done := make(chan accepted, 1)
	go func() {
		_, client, err := l.accept(stop, make([]byte, 2048), log)
		done <- accepted{client, err}
	}()

	spam, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(spam)
	const n = 1000
	for range n {
		if err := unix.Sendto(spam, []byte("x"), 0, &unix.SockaddrUnix{Name: path}); err != nil {
			t.Fatalf("sending from an unbound socket: %v", err)
		}
	}
	vmPath := filepath.Join(dir, "vm.sock")
	sendFromVM(t, vmPath, path)
	select {
	case a := <-done:
		if a.err != nil || a.client != vmPath {
			t.Fatalf("accept: %q, %v", a.client, a.err)
		}
	case <-time.After(10 * time.Second):
		signal(stop)
		t.Fatal("the bound client was not accepted")
	}
	if got := strings.Count(out.String(), "unbound client"); got != 1 {
		t.Errorf("%d datagrams from an unbound client logged %d lines, want 1:\n%.500s", n, got, out.String())
	}

	// The period over (moved back, not waited for), the next line counts
	// what was left out.
	var out2 bytes.Buffer
	log2 := &Logger{w: &out2}
	lim := &Limited{every: time.Hour}
	for range n {
		log2.WarnLimited(lim, "main", "ignoring")
	}
	lim.last = lim.last.Add(-2 * time.Hour)
	log2.WarnLimited(lim, "main", "ignoring")
	if lines := strings.Split(strings.TrimSpace(out2.String()), "\n"); len(lines) != 2 || !strings.Contains(lines[1], "(999 more like this") {
		t.Errorf("log:\n%s", out2.String())
	}
}

// TestServingProcsWhenVMComes: a relay started with IdleEnv (one P)
// waits for its VM on that one, and has servingProcs once the VM came.
func TestServingProcsWhenVMComes(t *testing.T) {
	was := runtime.GOMAXPROCS(1)
	defer runtime.GOMAXPROCS(was)
	l, dir, stop := listenForTest(t)
	tap, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(tap[0])
	defer unix.Close(tap[1])
	unix.SetNonblock(tap[0], true)
	if err := unix.SetsockoptTimeval(tap[1], unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 10}); err != nil {
		t.Fatal(err)
	}
	var out testutil.Buffer
	log := &Logger{w: &out}
	r := &relay{tap: tap[0], sock: l.fd, stop: stop, frame: 1514, host: &counters{}, vm: &counters{}, log: log}
	r.stream.conn, r.stream.done = -1, -1
	done := make(chan error, 1)
	go func() { done <- forward(r, l, "tap0", nil, log) }()
	defer func() {
		signal(stop)
		if err := <-done; err != nil {
			t.Errorf("forward: %v", err)
		}
	}()
	testutil.Eventually(t, 10*time.Second, func() bool { return strings.Contains(out.String(), "waiting for client") }, "the relay to wait for its VM")
	if n := runtime.GOMAXPROCS(0); n != 1 {
		t.Errorf("waiting for its VM with %d Ps, want 1", n)
	}
	sendFromVM(t, filepath.Join(dir, "vm.sock"), l.path)
	buf := make([]byte, 2048)
	for {
		_, err := unix.Read(tap[1], buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			t.Fatalf("the VM's first frame on the TAP: %v", err)
		}
		break
	}
	if n := runtime.GOMAXPROCS(0); n != servingProcs {
		t.Errorf("serving its VM with %d Ps, want %d", n, servingProcs)
	}
}

// listenForTest is a helper's --socket listener in a folder of the
// test's (dir), and the eventfd that stops what serves it.
func listenForTest(t *testing.T) (l *Listener, dir string, stop int) {
	t.Helper()
	dir = t.TempDir()
	l, err := Listen(filepath.Join(dir, "h.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if stop, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(stop) })
	return l, dir, stop
}

// sendFromVM sends a 64-byte frame to the helper's socket at to from a
// VM's socket bound at from, as a VMM's is; the socket stays open for the
// test.
func sendFromVM(t *testing.T, from, to string) {
	t.Helper()
	vm, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(vm) })
	if err := unix.Bind(vm, &unix.SockaddrUnix{Name: from}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Sendto(vm, make([]byte, 64), 0, &unix.SockaddrUnix{Name: to}); err != nil {
		t.Fatal(err)
	}
}
