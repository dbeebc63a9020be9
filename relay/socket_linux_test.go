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
	dir := t.TempDir()
	path := filepath.Join(dir, "h.sock")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	stop, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(stop)
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
	vm, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(vm)
	vmPath := filepath.Join(dir, "vm.sock")
	if err := unix.Bind(vm, &unix.SockaddrUnix{Name: vmPath}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Sendto(vm, make([]byte, 64), 0, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
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
	dir := t.TempDir()
	path := filepath.Join(dir, "h.sock")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
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
	stop, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(stop)
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
	vm, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(vm)
	if err := unix.Bind(vm, &unix.SockaddrUnix{Name: filepath.Join(dir, "vm.sock")}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Sendto(vm, make([]byte, 64), 0, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
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
