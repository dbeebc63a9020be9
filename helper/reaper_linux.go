package helper

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/helperexec"
	"github.com/vmnetctl/vmnetctl/pollset"
	"github.com/vmnetctl/vmnetctl/procid"
	"github.com/vmnetctl/vmnetctl/relay"
)

// linkReaper is this process's link reaper (relay.Reap) for the TAPs of
// one owner that Prepare makes: one vmnetctl-relay at bin, started on
// first use and again if it has exited, for every `attach: tap` VM of a
// controller, where each such VM had a cleanup child of its own.
//
// It keeps a copy of the read end of each watched TAP's holders' pipe
// (kept) until the holders are gone and the reaper of the moment has it:
// a reaper that exits (killed) has its TAPs given to the one started
// next, which deletes at once those whose holders went meanwhile. (Their
// holders read EOF from the dead reaper's pipe, and stop without waiting
// for their TAP's deletion.)
type linkReaper struct {
	bin, owner string

	mu    sync.Mutex
	ctl   int           // this process's end of its socket; -1: none runs
	child *procid.Child // the reaper on ctl
	run   int           // counts the reapers started: which one ctl is
	// restart is when a reaper may be started again after one that
	// exited soon after its start (backoff): one that cannot run (an
	// older vmnetctl-relay in its place, say) is not started in a loop.
	restart time.Time
	backoff time.Duration
	later   *time.Timer // a regive at restart, if one waits
	kept    map[int32]*keptTAP
	ep      *pollset.Set // kept's descriptors; nil until first used
	gen     int32        // the last keptTAP.gen
}

// keptTAP is a kept descriptor's TAP, the reaper (run) that has it, and
// the number its events carry (a descriptor's number is reused once it is
// closed: an event read before then is not the new one's).
type keptTAP struct {
	e      relay.ReapEntry
	run    int
	gen    int32
	polled bool // in ep
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
	for range 2 {
		if r.ctl < 0 {
			if err = r.start(); err != nil {
				break
			}
			// (Before the exit of the one before is told, maybe.)
			r.regive()
			if r.ctl < 0 {
				err = errors.New("the link reaper exited as it started")
				continue // (abandoned by regive)
			}
		}
		err = relay.SendReapEntry(r.ctl, e, alive[0], fin[1], r.stallCheck())
		if err == nil {
			r.keep(alive[0], e)
			return keep, done, nil
		}
		if errors.Is(err, relay.ErrReapRefused) {
			break // (the reaper goes on)
		}
		r.abandon(err) // another, once
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
	r.ctl, r.child = fds[0], child
	r.run++
	run := r.run
	started := time.Now()
	child.OnExit(func(err error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.run == run && r.ctl >= 0 {
			unix.Close(r.ctl)
			r.ctl = -1
		}
		// One that lived a while is replaced at once; one that exited
		// soon after its start, after a wait that doubles each time.
		if lived := time.Since(started); lived < reaperMinLife {
			r.backoff = min(max(2*r.backoff, reaperMinLife), reaperMaxBackoff)
		} else {
			r.backoff = 0
		}
		r.restart = time.Now().Add(r.backoff)
		fmt.Fprintf(os.Stderr, "link reaper %d exited (%v): its TAPs go to another\n", child.Pid, err)
		r.regive()
	})
	return nil
}

// reaperMinLife is how long a reaper must have run for its exit to be
// no sign that the next would exit as soon; reaperMaxBackoff the longest
// a regive waits after such exits.
const (
	reaperMinLife    = time.Second
	reaperMaxBackoff = time.Minute
)

// reaperStall is how long a reaper may leave an entry unanswered while
// it makes no progress (no CPU used, nothing runnable: stopped, say)
// before it counts as stuck, as a helper that starts; a busy one, slow on
// a loaded machine, is waited for. A variable for tests.
var reaperStall = helperexec.DefaultStallTimeout

// errReaperStuck is a reaper that made no progress for reaperStall with
// an entry unanswered.
var errReaperStuck = errors.New("stuck")

// stallCheck is SendReapEntry's waiting for the reaper of the moment,
// which watches its progress from the first time the answer is late.
func (r *linkReaper) stallCheck() func() error {
	var watch *helperexec.StallWatch
	pid := r.child.Pid
	return func() error {
		if watch == nil {
			watch = helperexec.NewStallWatch(pid, reaperStall, nil, "the link reaper")
		}
		if err := watch.Check(time.Now()); err != nil {
			return fmt.Errorf("%w: %w", errReaperStuck, err)
		}
		return nil
	}
}

// abandon gives up the reaper of the moment after err, a failure of its
// socket or its stall: it is killed (harmless if it is gone; through its
// pidfd, never another process), so that no two reapers watch the same
// TAPs once the next has been given them. Call with r.mu held.
func (r *linkReaper) abandon(err error) {
	fmt.Fprintf(os.Stderr, "link reaper %d: %v; killed, its TAPs go to another\n", r.child.Pid, err)
	r.child.Signal(syscall.SIGKILL)
	unix.Close(r.ctl)
	r.ctl = -1
}

// keep keeps a copy of alive, the read end of e's holders' pipe, which
// the reaper of this run has. Call with r.mu held.
func (r *linkReaper) keep(alive int, e relay.ReapEntry) {
	if r.ep == nil {
		ep, err := pollset.New()
		if err != nil {
			return // (kept none: a reaper's exit loses its TAPs)
		}
		r.ep = ep
		r.kept = map[int32]*keptTAP{}
		go r.keeper()
	}
	dup, err := unix.FcntlInt(uintptr(alive), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return
	}
	r.gen++
	r.kept[int32(dup)] = &keptTAP{e: e, run: r.run, gen: r.gen, polled: true}
	if r.ep.Add(dup, r.gen) != nil {
		delete(r.kept, int32(dup))
		unix.Close(dup)
	}
}

// keeper drops the kept descriptors whose holders are gone, once the
// reaper of the moment has them (given again first if theirs exited).
func (r *linkReaper) keeper() {
	var evs [64]unix.EpollEvent
	for {
		n := r.ep.Wait(evs[:])
		if n == 0 {
			return // (it cannot be waited on)
		}
		r.mu.Lock()
		for _, ev := range evs[:n] {
			k := r.kept[ev.Fd]
			if k == nil || k.gen != ev.Pad {
				continue
			}
			if r.ctl >= 0 && relay.HungUp(r.ctl) {
				// Its reaper is gone, its exit not told yet, or it
				// closed its socket (a failed read): killed, so that
				// the next is the only one that has its TAPs.
				r.abandon(errors.New("its socket hung up"))
			}
			if k.run != r.run || r.ctl < 0 {
				r.regive() // (the next reaper deletes the TAP)
			}
			if k.run != r.run || r.ctl < 0 {
				// No reaper has it now (a restart waits out its
				// backoff): kept, no longer polled (its EOF would
				// wake this at once again); the regive that starts
				// the next gives it and polls it again.
				if k.polled {
					r.ep.Remove(int(ev.Fd))
					k.polled = false
				}
				continue
			}
			r.drop(ev.Fd)
		}
		r.mu.Unlock()
	}
}

// drop closes kept descriptor fd, if it is still kept. Call with r.mu
// held.
func (r *linkReaper) drop(fd int32) {
	k := r.kept[fd]
	if k == nil {
		return
	}
	if k.polled {
		r.ep.Remove(int(fd))
	}
	unix.Close(int(fd))
	delete(r.kept, fd)
}

// regive starts a reaper if none runs and gives it every kept TAP its
// own does not have; one it cannot take is dropped, left to the
// controller and `down` (they know it by its mark). Call with r.mu held.
func (r *linkReaper) regive() {
	stale := false
	for _, k := range r.kept {
		stale = stale || k.run != r.run
	}
	if !stale && (r.ctl >= 0 || len(r.kept) == 0) {
		return
	}
	if r.ctl < 0 {
		if wait := time.Until(r.restart); wait > 0 {
			// After a wait: the reaper before exited soon after its
			// start. (A VM's watch in between starts one itself.)
			if r.later == nil {
				r.later = time.AfterFunc(wait, func() {
					r.mu.Lock()
					defer r.mu.Unlock()
					r.later = nil
					r.regive()
				})
			}
			return
		}
		if err := r.start(); err != nil {
			fmt.Fprintf(os.Stderr, "link reaper: %v; %d TAPs left to down\n", err, len(r.kept))
			for fd := range r.kept {
				r.drop(fd)
			}
			return
		}
	}
	stalled := r.stallCheck()
	for fd, k := range r.kept {
		if k.run == r.run {
			continue
		}
		// The kept descriptor is its done end too: the holders read
		// EOF from the reaper that died and wait for no other, and a
		// reaper only closes its done end. (A pipe of its own would be
		// a failure of this process's, out of descriptors, that left
		// the TAP to no reaper.)
		err := relay.SendReapEntry(r.ctl, k.e, int(fd), int(fd), stalled)
		switch {
		case errors.Is(err, relay.ErrReapRefused):
			fmt.Fprintf(os.Stderr, "link reaper: %s: %v; left to down\n", k.e.Name, err)
			r.drop(fd)
			continue
		case err != nil:
			// Gone, going or stuck: its exit gives what is left to the
			// next, after the backoff of a reaper that did not last.
			r.abandon(err)
			return
		}
		k.run = r.run
		if !k.polled {
			if r.ep.Add(int(fd), k.gen) != nil {
				r.drop(fd) // (the reaper has its own copy)
				continue
			}
			k.polled = true
		}
	}
}
