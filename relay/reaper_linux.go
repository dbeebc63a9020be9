package relay

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	gosignal "os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/rtlink"
)

// A link reaper is one vmnetctl-relay that deletes the persistent TAPs of
// every `attach: tap` VM a controller set up, each once its holders are
// gone: what a cleanup child (DeleteLinkOnEOF) does for one TAP, for all
// of them, so that a fleet of such VMs runs one process a VM (the relay
// that holds its TAP) and not two.
//
// The controller gives it each TAP over a socket (SOCK_SEQPACKET) as a
// ReapEntry and two descriptors: the read end of a pipe whose write end
// the TAP's holders keep (the controller until it has started the relay,
// then the relay), and the write end of a pipe whose read end the relay
// reads (Spec.CleanupDone). Once every holder of the first has closed it
// (exited, however), the reaper deletes the link if it is still the TAP
// made (ReapEntry) and closes the second: the relay that waits reads EOF.
// It answers each entry with one byte, once it watches it; the controller
// closes its copies of the reaper's ends only then, so that an entry is
// either watched or its sender knows it is not.
//
// It ignores the signals of its process group and outlives its controller
// for as long as it watches TAPs: a controller killed beside its fleet
// leaves the relays holding their TAPs, and the reaper deleting each when
// its relay ends; it exits once its controller's end of the socket is
// closed and it watches none.

// EnvReaper, in vmnetctl-relay's environment, makes it a link reaper
// whose controller's socket is the descriptor it names.
const EnvReaper = "VMNETCTL_RELAY_REAPER"

// ReapArg is a reaper's first argument, before its owner (the state
// dir's, hostnet.Owner): what ps shows of it.
const ReapArg = "reap-links"

// ReapEntry is a link a reaper deletes once its holders are gone: the
// link of interface index Index if it still has name Name and alias Mark.
type ReapEntry struct {
	Index int    `json:"index"`
	Name  string `json:"name"`
	Mark  string `json:"mark"`
}

// Reap answers: reapWatching once the entry is watched, reapRefused for
// one it cannot watch.
const (
	reapWatching byte = 1
	reapRefused  byte = 2
)

// ErrReapRefused is a reaper's answer to an entry it will not watch: the
// reaper itself goes on.
var ErrReapRefused = errors.New("the link reaper refused")

// reapAnswerCheck is how often SendReapEntry asks its caller whether to
// wait on for a reaper's answer.
const reapAnswerCheck = time.Second

// maxReapEntry bounds an entry's encoding (a name, a mark, an index).
const maxReapEntry = 1024

// ReaperCommand is the link reaper of the state dir whose owner is owner:
// vmnetctl-relay at bin, its controller's end of the socket to be its
// first extra file (descriptor 3). In a process group of its own, as a
// cleanup child (CleanupCommand).
func ReaperCommand(bin, owner string) *exec.Cmd {
	return &exec.Cmd{Path: bin, Args: []string{bin, ReapArg, owner},
		Env:         []string{EnvReaper + "=3", IdleEnv},
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true}}
}

// SendReapEntry gives e, with alive (the read end of the holders' pipe)
// and done (the write end of the relay's), to the reaper on socket ctl,
// and waits for its answer: nil once it watches them. Any other error
// says the reaper is gone or refused them, or is waiting's: while the
// answer is not there, waiting (if not nil) is asked every
// reapAnswerCheck whether to go on waiting (nil) or give up (its error).
// The caller's copies of alive and done are its own to close either way.
func SendReapEntry(ctl int, e ReapEntry, alive, done int, waiting func() error) error {
	msg, err := json.Marshal(e)
	if err != nil {
		return err
	}
	if len(msg) > maxReapEntry {
		return fmt.Errorf("a reaper's entry of %d bytes", len(msg))
	}
	if err := unix.Sendmsg(ctl, msg, unix.UnixRights(alive, done), nil, unix.MSG_NOSIGNAL); err != nil {
		return fmt.Errorf("the link reaper: %w", err)
	}
	var b [1]byte
	for {
		if waiting != nil {
			fds := []unix.PollFd{{Fd: int32(ctl), Events: unix.POLLIN}}
			n, err := unix.Poll(fds, int(reapAnswerCheck/time.Millisecond))
			if err == unix.EINTR {
				continue
			}
			if err == nil && n == 0 {
				if err := waiting(); err != nil {
					return err
				}
				continue
			}
		}
		n, err := unix.Read(ctl, b[:])
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return fmt.Errorf("the link reaper: %w", err)
		case n == 0:
			return errors.New("the link reaper exited")
		case b[0] != reapWatching:
			return fmt.Errorf("%w %s", ErrReapRefused, e.Name)
		}
		return nil
	}
}

// Reap is vmnetctl-relay as a link reaper (ReaperCommand), its
// controller's socket descriptor ctl. It returns once that socket is
// closed and no TAP is left to watch.
func Reap(ctl int) error {
	// (SIGPIPE too: a log whose reader is gone must not end it.)
	gosignal.Ignore(syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGPIPE)
	return reap(ctl)
}

// reap is Reap but for the signals.
func reap(ctl int) error {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return err
	}
	defer unix.Close(ep)
	r := &reaper{ep: ep, ctl: ctl, watched: map[int32]reaping{}, slots: make(chan struct{}, maxDeleting)}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, ctl, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(ctl)}); err != nil {
		return err
	}
	defer r.deleting.Wait()
	evs := make([]unix.EpollEvent, 64)
	for r.ctl >= 0 || len(r.watched) > 0 {
		n, err := unix.EpollWait(ep, evs, -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		for _, ev := range evs[:n] {
			if int(ev.Fd) == r.ctl {
				r.receive()
			} else {
				r.ended(ev.Fd)
			}
		}
	}
	return nil
}

// reaper is Reap's state: ctl is -1 once closed; watched are the TAPs by
// their alive descriptor.
type reaper struct {
	ep, ctl int
	watched map[int32]reaping
	buf     [maxReapEntry + 1]byte
	oob     [64]byte
	// deleting are the deletions under way, at most maxDeleting at once
	// (slots): a link's deletion waits for the kernel (its unregister
	// waits out RCU grace periods, some 10 to 20 ms here), and one after
	// the other a fleet's `down` of 1,000 TAPs took 21 s, where their
	// cleanup children, deleting side by side, took 10.
	deleting sync.WaitGroup
	slots    chan struct{}
}

// maxDeleting bounds a reaper's deletions under way, each a thread in a
// netlink request.
const maxDeleting = 32

type reaping struct {
	e    ReapEntry
	done int
}

// receive takes one entry from the controller, or its socket's end.
func (r *reaper) receive() {
	n, oobn, _, _, err := unix.Recvmsg(r.ctl, r.buf[:], r.oob[:], unix.MSG_CMSG_CLOEXEC)
	if err == unix.EINTR || err == unix.EAGAIN {
		return
	}
	var fds []int
	if err == nil {
		if cms, perr := unix.ParseSocketControlMessage(r.oob[:oobn]); perr == nil {
			for _, cm := range cms {
				if got, perr := unix.ParseUnixRights(&cm); perr == nil {
					fds = append(fds, got...)
				}
			}
		}
	}
	if err != nil || n == 0 && len(fds) == 0 {
		// The controller is gone: the TAPs it gave are watched still.
		unix.EpollCtl(r.ep, unix.EPOLL_CTL_DEL, r.ctl, nil)
		unix.Close(r.ctl)
		r.ctl = -1
		return
	}
	var e ReapEntry
	ok := len(fds) == 2 && n <= maxReapEntry && json.Unmarshal(r.buf[:n], &e) == nil && e.Index > 0 && e.Name != ""
	if ok {
		alive := fds[0]
		ok = unix.EpollCtl(r.ep, unix.EPOLL_CTL_ADD, alive, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(alive)}) == nil
		if ok {
			r.watched[int32(alive)] = reaping{e: e, done: fds[1]}
		}
	}
	if !ok {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
	answer := []byte{reapRefused}
	if ok {
		answer[0] = reapWatching
	}
	unix.Write(r.ctl, answer)
}

// ended reads what alive says: EOF once its holders are gone, when the
// TAP is deleted (if it is still the one made) and the relay told.
// Anything written to it is read and dropped.
func (r *reaper) ended(alive int32) {
	w, ok := r.watched[alive]
	if !ok {
		return
	}
	var b [64]byte
	n, err := unix.Read(int(alive), b[:])
	if n > 0 || err == unix.EINTR || err == unix.EAGAIN {
		return
	}
	unix.EpollCtl(r.ep, unix.EPOLL_CTL_DEL, int(alive), nil)
	unix.Close(int(alive))
	delete(r.watched, alive)
	// Opened here, in the namespace of Reap's thread, whichever thread
	// the deletion runs on.
	c, err := rtlink.Open()
	if err != nil {
		fmt.Fprintf(os.Stderr, "ERROR [reaper] deleting TAP %s: %v\n", w.e.Name, err)
		unix.Close(w.done)
		return
	}
	// The slot is waited for there: the loop goes on answering the
	// controller while the kernel is slow.
	r.deleting.Go(func() {
		r.slots <- struct{}{}
		defer func() { <-r.slots }()
		defer c.Close()
		if err := deleteMarkedLinkOn(c, w.e.Index, w.e.Name, w.e.Mark); err != nil {
			fmt.Fprintf(os.Stderr, "ERROR [reaper] %v\n", err)
		}
		unix.Close(w.done)
	})
}

// ReaperFD is the controller's socket a reaper was started with
// (EnvReaper), removed from the environment.
func ReaperFD() (int, error) {
	v := os.Getenv(EnvReaper)
	os.Unsetenv(EnvReaper)
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return -1, fmt.Errorf("%s=%q: not a descriptor", EnvReaper, v)
	}
	return fd, nil
}
