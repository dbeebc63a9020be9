package helper

import (
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/relay"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// reaperTap makes a persistent TAP name in host, marked mark, and returns
// its reaper's entry.
func reaperTap(t *testing.T, host *testutil.NS, name string) relay.ReapEntry {
	t.Helper()
	e := relay.ReapEntry{Name: name, Mark: "vmnetctl:tap=" + name + "@reapertest"}
	host.MustDo(t, func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		ifr, _ := unix.NewIfreq(name)
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			return err
		}
		if err := unix.IoctlSetInt(fd, unix.TUNSETPERSIST, 1); err != nil {
			return err
		}
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		e.Index = l.Attrs().Index
		return netlink.LinkSetAlias(l, e.Mark)
	})
	return e
}

// testReaper is a link reaper of its own (not the process's), running
// vmnetctl-relay built for the test; killed, with what it keeps dropped,
// when the test ends.
func testReaper(t *testing.T) *linkReaper {
	bin, err := testutil.Build(t.TempDir(), testutil.RelayPackage)
	if err != nil {
		t.Fatal(err)
	}
	r := &linkReaper{bin: bin, owner: "reapertest", ctl: -1}
	t.Cleanup(func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		for fd := range r.kept {
			r.drop(fd)
		}
		if r.later != nil {
			r.later.Stop()
		}
		if r.child != nil {
			r.child.Signal(syscall.SIGKILL)
		}
	})
	return r
}

// TestReaperStopped: a link reaper that stops answering and makes no
// progress (stopped) is killed after the stall window, and the next VM's
// TAP goes to a new one, with the TAPs the stopped one watched: each is
// deleted once its holders are gone.
func TestReaperStopped(t *testing.T) {
	testutil.RequireRoot(t, "TAPs")
	defer func(d time.Duration) { reaperStall = d }(reaperStall)
	reaperStall = 2 * time.Second
	host := testutil.NewNS(t, "rstop")
	r := testReaper(t)
	e0, e1 := reaperTap(t, host, "rstop0"), reaperTap(t, host, "rstop1")
	var keep0, done0, keep1, done1 *os.File
	host.MustDo(t, func() (err error) { keep0, done0, err = r.watch(e0); return err })
	old := r.child
	// Its exit seen through a pidfd of the test's own: the reaper's
	// Child has its one OnExit, the linkReaper's.
	pidfd, err := unix.PidfdOpen(old.Pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pidfd)
	old.Signal(syscall.SIGSTOP)
	watched := make(chan error, 1)
	go func() {
		watched <- host.Do(func() (err error) { keep1, done1, err = r.watch(e1); return err })
	}()
	select {
	case err := <-watched:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatalf("a minute on, the watch still waits for a reaper stopped for %v", reaperStall)
	}
	if n, err := unix.Poll([]unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}, int(time.Minute/time.Millisecond)); n != 1 {
		t.Errorf("the stopped reaper %d was not killed: %v", old.Pid, err)
	}
	if r.child == old {
		t.Fatal("no new reaper")
	}
	for _, w := range []struct {
		e          relay.ReapEntry
		keep, done *os.File
	}{{e0, keep0, done0}, {e1, keep1, done1}} {
		w.keep.Close()
		testutil.Eventually(t, time.Minute, func() error {
			var err error
			host.MustDo(t, func() error { _, err = netlink.LinkByIndex(w.e.Index); return nil })
			if err == nil {
				return fmt.Errorf("%s is there", w.e.Name)
			}
			return nil
		}, "%s to be deleted once its holders are gone", w.e.Name)
		var b [1]byte
		if n, err := w.done.Read(b[:]); n != 0 || err == nil {
			t.Errorf("%s's done end: read %d, %v; want EOF", w.e.Name, n, err)
		}
		w.done.Close()
	}
}

// TestReaperRestartBackoff: a reaper that exits soon after its start (an
// older vmnetctl-relay in its place, say) is started again only after a
// wait that grows, not in a loop.
func TestReaperRestartBackoff(t *testing.T) {
	testutil.RequireRoot(t, "TAPs")
	host := testutil.NewNS(t, "rback")
	r := testReaper(t)
	e := reaperTap(t, host, "rback0")
	var keep, done *os.File
	host.MustDo(t, func() (err error) { keep, done, err = r.watch(e); return err })
	defer keep.Close()
	defer done.Close()
	// Its TAP kept for the next; the next exits at once.
	r.mu.Lock()
	r.bin = "/bin/false"
	old := r.child
	r.mu.Unlock()
	old.Signal(syscall.SIGKILL)
	state := func() (run int, backoff time.Duration, restart time.Time) {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.run, r.backoff, r.restart
	}
	testutil.Eventually(t, time.Minute, func() error {
		if _, b, _ := state(); b < 2*reaperMinLife {
			return fmt.Errorf("backoff %v", b)
		}
		return nil
	}, "two quick exits")
	run, _, restart := state()
	testutil.Eventually(t, time.Minute, func() error {
		if n, _, _ := state(); n == run {
			return fmt.Errorf("still run %d", n)
		}
		return nil
	}, "the next start")
	if now := time.Now(); now.Before(restart) {
		t.Errorf("started again %v before its backoff ended", restart.Sub(now))
	}
}

// TestReaperBackoffKeepsTAPs: a TAP whose holders go while no reaper runs
// (its restart waits out a backoff) is kept for the next reaper, which
// deletes it, and the descriptor kept for it is closed then.
func TestReaperBackoffKeepsTAPs(t *testing.T) {
	testutil.RequireRoot(t, "TAPs")
	host := testutil.NewNS(t, "rkeep")
	r := testReaper(t)
	real := r.bin
	e := reaperTap(t, host, "rkeep0")
	var keep, done *os.File
	host.MustDo(t, func() (err error) { keep, done, err = r.watch(e); return err })
	defer done.Close()
	r.mu.Lock()
	r.bin = "/bin/false" // the next reapers exit at once
	old := r.child
	r.mu.Unlock()
	old.Signal(syscall.SIGKILL)
	testutil.Eventually(t, time.Minute, func() error {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.ctl >= 0 || r.later == nil {
			return fmt.Errorf("ctl %d, a restart waiting %v", r.ctl, r.later != nil)
		}
		return nil
	}, "a restart that waits out its backoff")
	// The holders go while none runs; then the reaper can run again.
	keep.Close()
	testutil.Eventually(t, time.Minute, func() error {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, k := range r.kept {
			if k.polled {
				return fmt.Errorf("%s still polled", k.e.Name)
			}
		}
		if len(r.kept) != 1 {
			return fmt.Errorf("%d TAPs kept", len(r.kept))
		}
		return nil
	}, "the TAP kept, unpolled, while no reaper runs")
	// The restart made here, as the timer would: a reaper finds the
	// TAP by its index in its own namespace, and the timer's would start
	// in the host's.
	host.MustDo(t, func() error {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.later != nil {
			r.later.Stop()
			r.later = nil
		}
		r.bin, r.restart = real, time.Time{}
		r.regive()
		return nil
	})
	testutil.Eventually(t, time.Minute, func() error {
		var err error
		host.MustDo(t, func() error { _, err = netlink.LinkByIndex(e.Index); return nil })
		if err == nil {
			return fmt.Errorf("%s is there", e.Name)
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if len(r.kept) != 0 {
			return fmt.Errorf("%d descriptors kept", len(r.kept))
		}
		return nil
	}, "the next reaper to delete %s and the kept descriptor to be closed", e.Name)
}
