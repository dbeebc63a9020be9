package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	gosignal "os/signal"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/rtlink"
)

// Hold keeps a persistent TAP (Spec.Hold: `attach: tap`, which the VMM
// opens by name, as firecracker and cloud-hypervisor do) until ctx is
// done, or until the TAP is deleted behind its back: that ends it with an
// error that says so, and whoever runs it starts it again, which makes
// the TAP again, as a relay ends when its TAP goes. It hears of the
// deletion alone (rtlink.WatchDeletion), and looks whether the TAP is
// there once the watch is on, at each notice, and where the watch breaks
// once a second.
//
// Every s.StatsInterval it reads the TAP's kernel counters and logs them
// as a stats line while they move (and every heartbeatIntervals while
// they do not, as a relay does: helperproto.TapMeter.Due): on a TAP, tx is what the kernel gave the
// VM ("host") and rx what the VM sent. Frames the kernel drops towards a
// TAP no VMM holds (its carrier is off: no reader) are not drops of the
// helper's: a VM that is not running takes no frames. Drops are counted
// only while a VMM holds the TAP.
//
// When it stops it closes s.Keep, its end of the pipe to the TAP's
// cleanup child, which deletes the TAP once no one holds that pipe, and
// waits for the deletion (release), so that a helper started again at
// once makes its TAP anew rather than meeting the one about to go.
func Hold(ctx context.Context, s Spec, log *Logger, h Hooks) error {
	out := h.Stats
	if out == nil {
		out = &StatsOut{Log: log}
		if s.StatsFD > 0 {
			out.File = os.NewFile(uintptr(s.StatsFD), "stats")
		}
	}
	c, err := rtlink.Open()
	if err != nil {
		return fmt.Errorf("TAP %s: %w", s.TapName, err)
	}
	defer c.Close()
	t := &held{s: s, log: log, c: c, heard: make(chan error, 1), done: make(chan struct{})}
	defer close(t.done)
	if t.w, err = rtlink.WatchDeletion(s.TapIndex); err != nil {
		log.Warnf("main", "TAP %s: %v; looking once a second", s.TapName, err)
		t.poll()
	} else {
		go t.hear()
		defer t.w.Close()
	}
	log.Infof("main", "TAP %s is ready for the VMM; waiting for termination", s.TapName)
	var tick <-chan time.Time
	if s.StatsInterval > 0 {
		tk := time.NewTicker(s.StatsInterval)
		defer tk.Stop()
		tick = tk.C
	}
	var meter helperproto.TapMeter
	emit := func(l rtlink.Link, last bool) { out.Emit(meter.Stats(l.TapCounts(), time.Now()), last) }
	for gone := t.look(); !gone; {
		select {
		case <-ctx.Done():
			if s.StatsInterval > 0 {
				if l, gone, err := t.read(); err == nil && !gone {
					emit(l, true)
				}
			}
			log.Infof("main", "stopping: deleting TAP %s", s.TapName)
			t.release()
			return nil
		case <-tick:
			l, isGone, err := t.read()
			switch {
			case isGone:
				gone = true
			case err != nil:
				log.Warnf("stats", "TAP %s: %v", s.TapName, err)
			case meter.Due(l.TapCounts()):
				emit(l, false)
			}
		case err := <-t.heard:
			t.noticed(err)
			gone = t.look()
		case <-t.retry:
			gone = t.look()
		}
	}
	t.release()
	return fmt.Errorf("TAP %s was deleted", s.TapName)
}

// held is what Hold keeps of its TAP's watch.
type held struct {
	s   Spec
	log *Logger
	c   *rtlink.Conn
	w   *rtlink.Deletion // nil once broken: poll
	// heard gets the watch's every wake: nil for a notice, else the
	// error it stopped with (rtlink.NoticesLost: go on).
	heard chan error
	done  chan struct{} // closed once Hold returns
	// retry wakes the next look: each second without a watch, sooner
	// after a look that could not tell.
	retry <-chan time.Time
	wait  time.Duration // the wait before the next look that could not tell
}

// hear passes the watch's wakes on to heard until it breaks or closes.
func (t *held) hear() {
	for {
		err := t.w.Wait()
		select {
		case t.heard <- err:
		case <-t.done:
			return
		}
		if err != nil && !rtlink.NoticesLost(err) {
			return
		}
	}
}

// noticed takes a wake of the watch: a broken one is given up for a look
// once a second.
func (t *held) noticed(err error) {
	if err != nil && !rtlink.NoticesLost(err) {
		t.log.Warnf("main", "watching TAP %s: %v; looking once a second", t.s.TapName, err)
		t.w.Close()
		t.w = nil
		t.poll()
	}
}

// poll looks again in a second.
func (t *held) poll() { t.retry = time.After(time.Second) }

// read reads the TAP's link, and says whether it is gone: no link of its
// index, or one of another name (an index someone gave another link
// since). err is a read that could not tell.
func (t *held) read() (l rtlink.Link, gone bool, err error) {
	l, err = t.c.Link(t.s.TapIndex)
	if errors.Is(err, rtlink.ErrGone) || err == nil && l.Name != t.s.TapName {
		return rtlink.Link{}, true, nil
	}
	return l, false, err
}

// look says whether the TAP is gone. A look that cannot tell is tried
// again, 100 ms later and then up to a second apart, until it can (else
// a holder could go on with its TAP gone); without a watch, the next
// look is in a second either way.
func (t *held) look() (gone bool) {
	_, gone, err := t.read()
	switch {
	case gone:
		return true
	case err != nil:
		t.wait = min(max(2*t.wait, 100*time.Millisecond), time.Second)
		t.retry = time.After(t.wait)
	default:
		t.wait = 0
		t.retry = nil
		if t.w == nil {
			t.poll()
		}
	}
	return false
}

// release closes Keep, the holder's end of the pipe to the TAP's cleanup
// child, and waits until the TAP is gone: for that child with wait4 where
// it is this process's (CleanupPID, after a helper's exec); else for the
// TAP's deletion (its notice comes before the kernel has finished with
// the link: the child's own exit comes after that, tens of ms later here)
// or the child's exit, whichever comes first (EOF on CleanupDone: a child
// killed before it deleted the TAP ends the wait, and the TAP is then the
// next helper's or down's to remove: it carries this state dir's mark).
func (t *held) release() {
	for _, fd := range t.s.Keep {
		unix.Close(fd)
	}
	switch {
	case t.s.CleanupPID > 0:
		waitChild(t.s.CleanupPID)
	case t.s.CleanupDone > 0:
		unix.SetNonblock(t.s.CleanupDone, true) // (in Go's poller: Close ends the read)
		done := os.NewFile(uintptr(t.s.CleanupDone), "cleanup done")
		defer done.Close()
		exited := make(chan struct{})
		go func() {
			io.Copy(io.Discard, done)
			close(exited)
		}()
		for !t.look() {
			select {
			case <-exited:
				return
			case err := <-t.heard:
				t.noticed(err)
			case <-t.retry:
			}
		}
	}
}

// waitChild waits for child pid to exit and reaps it.
func waitChild(pid int) {
	for {
		if _, err := unix.Wait4(pid, nil, 0, nil); err != unix.EINTR {
			return
		}
	}
}

// CleanupCommand is the cleanup child of TAP name, of interface index,
// marked mark (netplane's mark of a VM port of this state dir's):
// vmnetctl-relay at bin as DeleteLinkOnEOF, its stdin to be the pipe's
// read end. In a process group of its own: signals to its starter's group
// (a controller's Ctrl-C) do not reach it before it ignores them. A
// controller started one a TAP before its link reaper (Reap) did that for
// all of them; vmnetctl-relay keeps the mode for a controller of an
// earlier build still running through an upgrade, which starts it from
// the binary installed.
func CleanupCommand(bin, name string, index int, mark string) *exec.Cmd {
	return &exec.Cmd{Path: bin, Args: []string{bin, CleanupArg, name},
		Env:         []string{EnvDeleteLink + "=" + strconv.Itoa(index), EnvDeleteMark + "=" + mark, IdleEnv},
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true}}
}

// DeleteLinkOnEOF is vmnetctl-relay as a TAP's cleanup child
// (CleanupCommand, from its command line and environment): it ignores the
// signals its process group gets, waits for EOF on r (every holder of the
// pipe's other end gone: the helper, however it ended), then deletes the
// link of interface index if it is still the one made: named name and
// marked mark. A TAP of the same name made since (a helper started
// again) has another index; a link given the index since (a link's maker
// may ask for one) has another name or mark.
func DeleteLinkOnEOF(index int, name, mark string, r io.Reader) error {
	gosignal.Ignore(syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	return deleteLinkOnEOF(index, name, mark, r)
}

// deleteLinkOnEOF is DeleteLinkOnEOF but for the signals.
func deleteLinkOnEOF(index int, name, mark string, r io.Reader) error {
	io.Copy(io.Discard, r)
	return deleteMarkedLink(index, name, mark)
}

// deleteMarkedLink deletes the link of interface index if it is named
// name and marked mark; one that is gone, or another, is not an error.
func deleteMarkedLink(index int, name, mark string) error {
	c, err := rtlink.Open()
	if err != nil {
		return err
	}
	defer c.Close()
	return deleteMarkedLinkOn(c, index, name, mark)
}

// deleteMarkedLinkOn is deleteMarkedLink through c, in c's network
// namespace.
func deleteMarkedLinkOn(c *rtlink.Conn, index int, name, mark string) error {
	l, err := c.Link(index)
	switch {
	case errors.Is(err, rtlink.ErrGone):
		return nil
	case err != nil:
		return fmt.Errorf("deleting TAP %s: %w", name, err)
	case l.Name != name || l.Alias != mark:
		return nil // not the TAP made: gone, and another link has its index
	}
	if err := c.Delete(index); err != nil {
		return fmt.Errorf("deleting TAP %s: %w", name, err)
	}
	return nil
}
