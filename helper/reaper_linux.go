package helper

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/procid"
	"github.com/vmnetctl/vmnetctl/relay"
)

// linkReaper is this process's link reaper (relay.Reap) for the TAPs of
// one owner that Prepare makes: one vmnetctl-relay at bin, started on
// first use and again if it has exited, for every `attach: tap` VM of a
// controller, where each such VM had a cleanup child of its own.
type linkReaper struct {
	bin, owner string

	mu  sync.Mutex
	ctl int // this process's end of its socket; -1: none runs
	run int // counts the reapers started: which one ctl is
}

// reapers are this process's link reapers, by program and owner (a
// controller has one; tests may run several state dirs).
var reapers struct {
	sync.Mutex
	m map[[2]string]*linkReaper
}

// reaperFor is the link reaper of owner's TAPs that runs bin.
func reaperFor(bin, owner string) *linkReaper {
	reapers.Lock()
	defer reapers.Unlock()
	if reapers.m == nil {
		reapers.m = map[[2]string]*linkReaper{}
	}
	key := [2]string{bin, owner}
	r := reapers.m[key]
	if r == nil {
		r = &linkReaper{bin: bin, owner: owner, ctl: -1}
		reapers.m[key] = r
	}
	return r
}

// watch has the reaper delete e's link once its holders are gone. It
// returns keep, the end of the pipe the holders keep (the link goes once
// every copy of it is closed), and done, which reads EOF once the reaper
// has handled the link. A reaper that exited is started again, once.
func (r *linkReaper) watch(e relay.ReapEntry) (keep, done *os.File, err error) {
	var alive, fin [2]int
	if err := unix.Pipe2(alive[:], unix.O_CLOEXEC); err != nil {
		return nil, nil, err
	}
	if err := unix.Pipe2(fin[:], unix.O_CLOEXEC); err != nil {
		unix.Close(alive[0])
		unix.Close(alive[1])
		return nil, nil, err
	}
	// The reaper's ends: its copies once it answers; ours closed then.
	defer unix.Close(alive[0])
	defer unix.Close(fin[1])
	keep, done = os.NewFile(uintptr(alive[1]), "cleanup of "+e.Name), os.NewFile(uintptr(fin[0]), "cleanup of "+e.Name+" done")
	r.mu.Lock()
	defer r.mu.Unlock()
	for try := range 2 {
		if r.ctl < 0 {
			if err = r.start(); err != nil {
				break
			}
		}
		if err = relay.SendReapEntry(r.ctl, e, alive[0], fin[1]); err == nil {
			return keep, done, nil
		}
		// Gone, or going: another, once.
		unix.Close(r.ctl)
		r.ctl = -1
		if try == 1 {
			break
		}
	}
	keep.Close()
	done.Close()
	return nil, nil, fmt.Errorf("%s would not be deleted once its VM's helper is gone: %w", e.Name, err)
}

// start starts the reaper. Its stderr is this process's where that is a
// file (a controller's log), else /dev/null: a reaper that `vmnetctl run`
// started outlives it, and must not hold its terminal or its reader's
// pipe open.
func (r *linkReaper) start() error {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	theirs := os.NewFile(uintptr(fds[1]), "link reaper's socket")
	cmd := relay.ReaperCommand(r.bin, r.owner)
	cmd.ExtraFiles = []*os.File{theirs}
	if fi, err := os.Stderr.Stat(); err == nil && fi.Mode().IsRegular() {
		cmd.Stderr = os.Stderr
	}
	child, err := procid.Start(cmd)
	theirs.Close()
	if err != nil {
		unix.Close(fds[0])
		return errors.Join(errors.New("starting the link reaper"), err)
	}
	r.ctl = fds[0]
	r.run++
	run := r.run
	child.OnExit(func(err error) {
		// Its TAPs are no longer watched: a holder that ends leaves
		// its TAP, to the next helper of the VM or `down` (both know
		// it by its mark). The next TAP starts another reaper.
		fmt.Fprintf(os.Stderr, "link reaper %d exited (%v): the TAPs it watched go with down, or are made anew by their helpers\n", child.Pid, err)
		r.mu.Lock()
		if r.run == run && r.ctl >= 0 {
			unix.Close(r.ctl)
			r.ctl = -1
		}
		r.mu.Unlock()
	})
	return nil
}
