package relay

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
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
