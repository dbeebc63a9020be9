package vhostuser

import (
	"bytes"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/helperproto"
)

// TestShapedLink: a shaped backend holds the frames to the guest for the
// delay before they reach its RX buffers, and sends each of the guest's
// frames twice when told to duplicate them all; unshaped, neither.
func TestShapedLink(t *testing.T) {
	l := newLab(t, func(c *Config) { c.Shaped = true })
	t.Cleanup(l.b.Close)
	const delay = 30 * time.Millisecond
	l.b.Shape(helperproto.Shapings{ToVM: helperproto.Shaping{Delay: delay}, FromVM: helperproto.Shaping{Duplicate: helperproto.ShapingScale}})
	f := connect(t, l.path)
	rx, tx := f.q[rxQueue], f.q[txQueue]
	rx.postRX(8)
	sent := time.Now()
	if _, err := unix.Write(l.port, frame(1, 100)); err != nil {
		t.Fatal(err)
	}
	u := rx.waitUsed(1)[0]
	if took := time.Since(sent); took < delay {
		t.Errorf("a frame to the guest delayed %v reached it in %v", delay, took)
	}
	if got := f.mem[rx.bufOff(u.Head):][:u.Len]; !bytes.Equal(got[NetHeaderSize:], frame(1, 100)) || got[10] != 1 {
		t.Errorf("the delayed frame: %d bytes, header %x", len(got), got[:NetHeaderSize])
	}
	rx.release([]UsedEntry{u})
	tx.offer(tx.sendFrame(frame(2, 80)))
	for i := range 2 {
		if got := l.readPort(t); !bytes.Equal(got, frame(2, 80)) {
			t.Fatalf("copy %d of the guest's frame: %d bytes", i, len(got))
		}
	}
	tx.release(tx.waitUsed(1))
	l.b.Shape(helperproto.Shapings{})
	tx.offer(tx.sendFrame(frame(3, 80)))
	if got := l.readPort(t); !bytes.Equal(got, frame(3, 80)) {
		t.Fatalf("unshaped: %d bytes", len(got))
	}
	tx.release(tx.waitUsed(1))
	tx.offer(tx.sendFrame(frame(5, 80)))
	if got := l.readPort(t); !bytes.Equal(got, frame(5, 80)) {
		t.Error("unshaped, the guest's frame came twice")
	}
	if _, err := unix.Write(l.port, frame(4, 100)); err != nil {
		t.Fatal(err)
	}
	rx.waitUsed(1)
}
