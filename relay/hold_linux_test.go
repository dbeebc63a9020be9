package relay

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// heldTap is a persistent TAP made for Hold, marked, up, and the VMM's
// descriptor of it.
type heldTap struct {
	name, mark string
	index, fd  int
}

func makeHeldTap(t *testing.T, host *testutil.NS, name string) heldTap {
	t.Helper()
	tap := heldTap{name: name, mark: "vmnetctl:tap=" + name + "@test"}
	host.MustDo(t, func() error {
		var err error
		if tap.fd, err = unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0); err != nil {
			return err
		}
		ifr, _ := unix.NewIfreq(name)
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
		if err := unix.IoctlIfreq(tap.fd, unix.TUNSETIFF, ifr); err != nil {
			return err
		}
		if err := unix.IoctlSetInt(tap.fd, unix.TUNSETPERSIST, 1); err != nil {
			return err
		}
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		tap.index = l.Attrs().Index
		if err := netlink.LinkSetAlias(l, tap.mark); err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
	t.Cleanup(func() { unix.Close(tap.fd) })
	return tap
}

// lastStats is the last stats line in log.
func lastStats(log string) (helperproto.Stats, bool) {
	var st helperproto.Stats
	ok := false
	for _, line := range strings.Split(log, "\n") {
		if s, isStats := helperproto.ParseStatsLine(line); isStats {
			st, ok = s, true
		}
	}
	return st, ok
}

// TestHold: a held TAP's counters as stats lines (what the VMM wrote into
// it is "vm"); on stop the holder closes its end of the cleanup pipe and
// returns only once the cleanup child (here a goroutine, as the real one
// does: deleteLinkOnEOF) has deleted the TAP; a TAP deleted behind its
// back ends it with an error that says so; a child that died without
// deleting ends the wait too.
func TestHold(t *testing.T) {
	host := testutil.NewNS(t, "hold")
	run := func(tap heldTap, ctx context.Context, log *testutil.Buffer, child func(r *os.File, done *os.File)) (string, error) {
		// Hold's ends are raw descriptors, which it closes, as the ones a
		// relay inherits; the child's are files.
		var keep, done [2]int
		if err := unix.Pipe2(keep[:], unix.O_CLOEXEC); err != nil {
			t.Fatal(err)
		}
		if err := unix.Pipe2(done[:], unix.O_CLOEXEC); err != nil {
			t.Fatal(err)
		}
		go child(os.NewFile(uintptr(keep[0]), "keep"), os.NewFile(uintptr(done[1]), "done"))
		spec := Spec{Hold: true, TAP: -1, Socket: -1, TapName: tap.name, TapIndex: tap.index, StatsInterval: 20 * time.Millisecond,
			Keep: []int{keep[1]}, CleanupDone: done[0]}
		err := host.Do(func() error { return Hold(ctx, spec, NewLogger(log, false, false), Hooks{}) })
		return log.String(), err
	}
	child := func(tap heldTap) func(r, done *os.File) {
		return func(r, done *os.File) {
			defer done.Close()
			host.Do(func() error { return deleteLinkOnEOF(tap.index, tap.name, tap.mark, r) })
		}
	}
	exists := func(name string) bool {
		_, err := host.Run(context.Background(), "ip", "link", "show", name)
		return err == nil
	}

	tap := makeHeldTap(t, host, "hold0")
	ctx, cancel := context.WithCancel(context.Background())
	frame := make([]byte, 60)
	copy(frame, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02, 0, 0, 0, 0, 1, 0x88, 0xb5})
	var held testutil.Buffer
	go func() {
		defer cancel()
		for range 3 {
			if _, err := unix.Write(tap.fd, frame); err != nil {
				t.Errorf("the VMM's write: %v", err)
			}
		}
		// Stopped once a stats line counted the frames.
		testutil.Eventually(t, 10*time.Second, func() bool {
			st, _ := lastStats(held.String())
			return st.VM.Packets == 3
		}, "a stats line with the VMM's 3 frames")
	}()
	log, err := run(tap, ctx, &held, child(tap))
	if err != nil {
		t.Fatalf("Hold stopped: %v\n%s", err, log)
	}
	if exists(tap.name) {
		t.Errorf("Hold returned before its TAP was deleted")
	}
	if st, ok := lastStats(log); !ok || st.VM.Packets != 3 || st.VM.Bytes != 3*60 {
		t.Errorf("last stats %+v (%v), want 3 frames of 60 bytes from the VM:\n%s", st, ok, log)
	}

	// Deleted behind its back.
	tap = makeHeldTap(t, host, "hold1")
	deleted := make(chan error, 1)
	go func() {
		_, err := host.Run(context.Background(), "ip", "link", "del", tap.name)
		deleted <- err
	}()
	if log, err := run(tap, context.Background(), &testutil.Buffer{}, child(tap)); err == nil || !strings.Contains(err.Error(), "TAP hold1 was deleted") {
		t.Errorf("Hold of a TAP deleted behind its back: %v\n%s", err, log)
	}
	if err := <-deleted; err != nil {
		t.Errorf("ip link del hold1: %v", err)
	}

	// A cleanup child that died: the stop does not wait for the TAP.
	tap = makeHeldTap(t, host, "hold2")
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	if _, err := run(tap, ctx, &testutil.Buffer{}, func(r, done *os.File) { r.Close(); done.Close() }); err != nil {
		t.Errorf("Hold with its cleanup child dead: %v", err)
	}
	if !exists(tap.name) {
		t.Errorf("TAP hold2 went, with no child to delete it")
	}
}

// TestDeleteLinkOnEOF: the cleanup child deletes the link of its index
// only while it is the TAP it was made for, named and marked so.
func TestDeleteLinkOnEOF(t *testing.T) {
	host := testutil.NewNS(t, "delete")
	tap := makeHeldTap(t, host, "del0")
	eof := strings.NewReader("")
	host.MustDo(t, func() error {
		if err := deleteLinkOnEOF(tap.index, tap.name, "vmnetctl:tap=del0@another", eof); err != nil {
			return err
		}
		if err := deleteLinkOnEOF(tap.index, "del1", tap.mark, eof); err != nil {
			return err
		}
		if _, err := netlink.LinkByIndex(tap.index); err != nil {
			return errors.New("deleted a link of another name or mark")
		}
		if err := deleteLinkOnEOF(tap.index, tap.name, tap.mark, eof); err != nil {
			return err
		}
		if _, err := netlink.LinkByIndex(tap.index); err == nil {
			return errors.New("the TAP made is still there")
		}
		return deleteLinkOnEOF(tap.index, tap.name, tap.mark, eof) // gone: not an error
	})
}
