package helper_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// streamConn frames a stream connection as qemu's -netdev stream does:
// each frame a 4-byte big-endian length, then the frame.
type streamConn struct{ c net.Conn }

func (s streamConn) Write(b []byte) (int, error) {
	buf := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(b)), uint32(len(b)))
	if _, err := s.c.Write(append(buf, b...)); err != nil {
		return 0, err
	}
	return len(b), nil
}

func (s streamConn) Read(b []byte) (int, error) {
	var l [4]byte
	if _, err := io.ReadFull(s.c, l[:]); err != nil {
		return 0, err
	}
	n := int(binary.BigEndian.Uint32(l[:]))
	if n > len(b) {
		return 0, io.ErrShortBuffer
	}
	return io.ReadFull(s.c, b[:n])
}

func (s streamConn) Close() error { return s.c.Close() }

// dialStream connects to the helper's stream socket as the VM's user
// would (the socket is theirs: here, root's).
func dialStream(t *testing.T, path string) net.Conn {
	t.Helper()
	var c net.Conn
	testutil.Eventually(t, 10*time.Second, func() (err error) { c, err = net.Dial("unix", path); return err }, "connecting to %s", path)
	t.Cleanup(func() { c.Close() })
	return c
}

// TestStream: a helper with --attach stream serves its --socket as qemu's
// -netdev stream (and lima's socket: networks) expects: a VM pings its
// gateway through it; its VMM goes and another connects with another MAC,
// which the port's guard learns; a client that sends a length no frame
// has is cut off, and the helper serves the next.
func TestStream(t *testing.T) {
	f := newFixture(t)
	path := filepath.Join(f.dir, "helper.sock")
	h := f.startHelper(t, nil, "--attach", "stream", "--socket", path)
	if fi, err := os.Stat(path); err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("the helper's socket: %v, %v", fi, err)
	}

	tap := openTap(t, f.vm, "vmeth0", false, 0)
	relay := startRelay(tap, streamConn{dialStream(t, path)}, 0)
	first, _ := net.ParseMAC("02:00:00:ab:00:01")
	f.setupVM(t, "vmeth0", first)
	testutil.Eventually(t, 10*time.Second, func() bool { return f.vm.Ping(gateway, 1) == nil }, "ping from the VM over the stream")
	relay.stop()

	// A client that sends a length shorter than any frame: cut off.
	bad := dialStream(t, path)
	if _, err := bad.Write([]byte{0, 0, 0, 3, 1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	// (Frames the network sent meanwhile may come first.)
	bad.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.Copy(io.Discard, bad); err != nil {
		t.Errorf("after a bad length the helper's end gave %v, want EOF", err)
	}

	tap = openTap(t, f.vm, "vmeth0", false, 0)
	relay = startRelay(tap, streamConn{dialStream(t, path)}, 0)
	defer relay.stop()
	second, _ := net.ParseMAC("02:00:00:ab:00:02")
	f.setupVM(t, "vmeth0", second)
	testutil.Eventually(t, 10*time.Second, func() bool { return f.vm.Ping(gateway, 1) == nil }, "ping from a new VMM with another MAC")
	testutil.Eventually(t, 5*time.Second, func() bool { return strings.Contains(h.stderr(), "a frame length out of bounds") },
		"the helper to say why it cut the client off")
}

// TestStreamFD: a VMM's connection handed to the helper (--attach stream
// --fd 3, as a network's stream socket hands each client over) is served
// until the VMM goes, and the helper ends with it.
func TestStreamFD(t *testing.T) {
	f := newFixture(t)
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	helperEnd, vmFile := os.NewFile(uintptr(fds[0]), "helper"), os.NewFile(uintptr(fds[1]), "vm")
	vmEnd, err := net.FileConn(vmFile)
	vmFile.Close() // (FileConn holds a copy)
	if err != nil {
		t.Fatal(err)
	}
	h := f.startHelper(t, []*os.File{helperEnd}, "--attach", "stream", "--fd", "3")
	helperEnd.Close()
	tap := openTap(t, f.vm, "vmeth0", false, 0)
	relay := startRelay(tap, streamConn{vmEnd}, 0)
	mac, _ := net.ParseMAC("02:00:00:ab:01:01")
	f.setupVM(t, "vmeth0", mac)
	testutil.Eventually(t, 10*time.Second, func() bool { return f.vm.Ping(gateway, 1) == nil }, "ping over a handed-over stream")
	relay.stop()
	testutil.Eventually(t, 10*time.Second, h.exited, "the helper to end with its VMM")
}

// TestStreamShaped: a stream helper with --shaping-file (its relay, past
// the exec into vmnetctl-relay) holds the frames to the VM for the delay
// and sends each twice; the file written anew and SIGUSR1 sent, it does
// neither.
func TestStreamShaped(t *testing.T) {
	f := newFixture(t)
	path := filepath.Join(f.dir, "helper.sock")
	shaping := filepath.Join(f.dir, "helper.shaping")
	if _, err := helperproto.WriteShapings(shaping, helperproto.Shapings{ToVM: helperproto.Shaping{Delay: 50 * time.Millisecond, Duplicate: helperproto.ShapingScale}}); err != nil {
		t.Fatal(err)
	}
	h := f.startHelper(t, nil, "--attach", "stream", "--socket", path, "--shaping-file", shaping)
	tap := openTap(t, f.vm, "vmeth0", false, 0)
	relay := startRelay(tap, streamConn{dialStream(t, path)}, 0)
	defer relay.stop()
	mac, _ := net.ParseMAC("02:00:00:ab:02:01")
	f.setupVM(t, "vmeth0", mac)
	testutil.Eventually(t, 10*time.Second, func() bool { return f.vm.Ping(gateway, 1) == nil }, "ping from the VM over the stream")
	ping := func() (least time.Duration, dups int) {
		out, _ := f.vm.Run(context.Background(), "ping", "-n", "-c", "5", "-i", "0.1", "-W", "5", gateway)
		least = time.Hour
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, "(DUP!)") {
				dups++
			} else if _, after, ok := strings.Cut(line, " time="); ok {
				var ms float64
				fmt.Sscanf(after, "%f ms", &ms)
				least = min(least, time.Duration(ms*float64(time.Millisecond)))
			}
		}
		return least, dups
	}
	if least, dups := ping(); least < 50*time.Millisecond || dups < 4 {
		t.Errorf("delayed 50 ms and doubled: least round trip %v, %d duplicates of 5", least, dups)
	}
	if _, err := helperproto.WriteShapings(shaping, helperproto.Shapings{}); err != nil {
		t.Fatal(err)
	}
	if err := h.cmd.Process.Signal(helperproto.ShapingSignal); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		return strings.Contains(h.stderr(), "shaping the link: to the VM nothing; from the VM nothing")
	}, "the relay to read its shaping again")
	if least, dups := ping(); least >= 50*time.Millisecond || dups != 0 {
		t.Errorf("shaped no more: least round trip %v, %d duplicates", least, dups)
	}
}
