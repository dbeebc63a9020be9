package relay

import (
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestReap: a link reaper watches the TAPs given to it, answers each entry
// (and refuses a malformed one), deletes a TAP once every copy of its
// holders' end is closed, but only the TAP made (its name and mark), and
// tells each by closing its done end; once its controller's end is
// closed it goes on for the TAPs it watches, and returns when none is
// left.
func TestReap(t *testing.T) {
	host := testutil.NewNS(t, "reap")
	taps := []heldTap{makeHeldTap(t, host, "reap0"), makeHeldTap(t, host, "reap1"), makeHeldTap(t, host, "reap2")}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctl := pair[0]
	reaped := make(chan struct{})
	var reapErr error
	go func() {
		defer close(reaped)
		reapErr = host.Do(func() error { return reap(pair[1]) })
	}()
	t.Cleanup(func() {
		unix.Close(ctl)
		select {
		case <-reaped:
		case <-time.After(time.Minute):
			t.Error("the reaper did not return a minute after the test")
		}
	})

	// A malformed entry is refused, its descriptors closed.
	var a, b [2]int
	if unix.Pipe2(a[:], unix.O_CLOEXEC) != nil || unix.Pipe2(b[:], unix.O_CLOEXEC) != nil {
		t.Fatal("pipes")
	}
	if err := unix.Sendmsg(ctl, []byte("{"), unix.UnixRights(a[0], b[1]), nil, 0); err != nil {
		t.Fatal(err)
	}
	var answer [1]byte
	if n, err := unix.Read(ctl, answer[:]); err != nil || n != 1 || answer[0] != reapRefused {
		t.Fatalf("answer to a malformed entry: %v %v, want refused", answer[:n], err)
	}
	unix.Close(a[0])
	unix.Close(b[1])
	if n, err := unix.Read(b[0], answer[:]); n != 0 || err != nil {
		t.Errorf("a refused entry's done end: read %d, %v; want EOF", n, err)
	}

	// reap0 as made; reap1 under another mark (not the TAP made).
	type watched struct{ keep, done int }
	var w []watched
	for i, tap := range taps {
		mark := tap.mark
		if i == 1 {
			mark = "vmnetctl:tap=reap1@another"
		}
		var alive, fin [2]int
		if unix.Pipe2(alive[:], unix.O_CLOEXEC) != nil || unix.Pipe2(fin[:], unix.O_CLOEXEC) != nil {
			t.Fatal("pipes")
		}
		if err := SendReapEntry(ctl, ReapEntry{Index: tap.index, Name: tap.name, Mark: mark}, alive[0], fin[1], nil); err != nil {
			t.Fatalf("%s: %v", tap.name, err)
		}
		unix.Close(alive[0])
		unix.Close(fin[1])
		w = append(w, watched{alive[1], fin[0]})
	}
	// done's EOF: the reaper handled the TAP. (One that returned first
	// would not: done is open in this process still.)
	handled := func(i int) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); ; {
			p := []unix.PollFd{{Fd: int32(w[i].done), Events: unix.POLLIN}}
			if n, err := unix.Poll(p, 100); err == nil && n > 0 {
				break
			}
			select {
			case <-reaped:
				t.Fatalf("the reaper returned (%v) while it watched %s", reapErr, taps[i].name)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s's holders gone a minute ago, and the reaper has not told", taps[i].name)
			}
		}
		if n, err := unix.Read(w[i].done, answer[:]); n != 0 || err != nil {
			t.Fatalf("%s's done end: read %d, %v; want EOF", taps[i].name, n, err)
		}
	}
	exists := func(i int) bool {
		t.Helper()
		var err error
		host.MustDo(t, func() error { _, err = netlink.LinkByIndex(taps[i].index); return nil })
		return err == nil
	}
	// A copy of the holders' end (the relay's) keeps the TAP. (Checked
	// once reap1's entry, given after reap0's, is handled: the reaper
	// has read reap0's pipe by then if it was to.)
	copyOf, err := unix.Dup(w[0].keep)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(w[0].keep)
	unix.Close(w[1].keep)
	handled(1)
	if p := []unix.PollFd{{Fd: int32(w[0].done), Events: unix.POLLIN}}; !exists(0) {
		t.Errorf("%s was deleted while a copy of its holders' end was open", taps[0].name)
	} else if n, _ := unix.Poll(p, 0); n > 0 {
		t.Errorf("%s's done end told while a copy of its holders' end was open", taps[0].name)
	}
	unix.Close(copyOf)
	handled(0)
	if exists(0) {
		t.Errorf("%s is there once its holders are gone", taps[0].name)
	}
	if !exists(1) {
		t.Errorf("%s was deleted under another mark than its entry's", taps[1].name)
	}
	// The controller gone: reap2 is watched still.
	unix.Close(ctl)
	ctl = -1
	// Once it has seen that (it closes its end), reap2's holders go.
	testutil.Eventually(t, time.Minute, func() bool {
		_, err := unix.FcntlInt(uintptr(pair[1]), unix.F_GETFD, 0)
		return err == unix.EBADF
	}, "the reaper to close its end of the socket")
	unix.Close(w[2].keep)
	handled(2)
	if exists(2) {
		t.Errorf("%s is there once its holders are gone, its controller gone before", taps[2].name)
	}
	select {
	case <-reaped:
		if reapErr != nil {
			t.Errorf("the reaper: %v", reapErr)
		}
	case <-time.After(time.Minute):
		t.Fatal("the reaper did not return with its controller and its TAPs gone")
	}
}
