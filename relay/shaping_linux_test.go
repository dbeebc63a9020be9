package relay

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestRelayShaped: a relay with a shaping file holds the frames to the VM
// for its delay; the file written anew and the shaping signal sent, it
// duplicates the VM's frames instead, and no longer delays.
func TestRelayShaped(t *testing.T) {
	path := filepath.Join(t.TempDir(), "shaping")
	const delay = 40 * time.Millisecond
	if _, err := helperproto.WriteShapings(path, helperproto.Shapings{ToVM: helperproto.Shaping{Delay: delay}}); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	logs := &testutil.Buffer{}
	e := startTestRelay(t, 1514, func(r *relay) {
		r.log = NewLogger(logs, false, false)
		t.Cleanup(r.followShapings(f))
	})
	buf := make([]byte, 2048)
	frame := bytes.Repeat([]byte{0xab}, 100)
	sent := time.Now()
	if _, err := unix.Write(e.tapPeer, frame); err != nil {
		t.Fatal(err)
	}
	recvFrame(t, e.vmPeer, buf)
	if took := time.Since(sent); took < delay {
		t.Errorf("a frame to the VM delayed %v took %v", delay, took)
	}
	if _, err := helperproto.WriteShapings(path, helperproto.Shapings{FromVM: helperproto.Shaping{Duplicate: helperproto.ShapingScale}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Kill(os.Getpid(), helperproto.ShapingSignal); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, func() error {
		if !strings.Contains(logs.String(), "shaping the link: to the VM nothing; from the VM duplicate 100%") {
			return os.ErrNotExist
		}
		return nil
	}, "the relay to read the new shaping")
	if _, err := unix.Write(e.vmPeer, frame); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if n := recvFrame(t, e.tapPeer, buf); n != len(frame) {
			t.Fatalf("copy %d: %d bytes", i, n)
		}
	}
	if _, err := unix.Write(e.tapPeer, frame); err != nil {
		t.Fatal(err)
	}
	recvFrame(t, e.vmPeer, buf)
}
