package procid

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/pollset"
)

// Child is a process this one started and holds by one pidfd. os/exec's
// Process holds a pidfd of its own and waits on it in a blocking waitid,
// a thread per process; waiting in Go's poller instead took a second
// pidfd, and two descriptors a helper put a controller of 10,000 helpers
// at its limit of 20,000 open files. A Child has the one, waits for it in
// the poller, and reaps with wait4 once it says the process exited.
type Child struct {
	Pid int
	h   *procHandle // nil where the kernel gives no pidfd (before 5.3)
}

// Start starts cmd as os/exec would: its Path, Args, Environ(), Dir,
// SysProcAttr, and its Stdin, Stdout and Stderr, each an *os.File or nil
// for /dev/null, then ExtraFiles from descriptor 3. Reap it with Wait, not
// with cmd.Wait: cmd.Process stays nil.
func Start(cmd *exec.Cmd) (*Child, error) {
	if cmd.Err != nil {
		return nil, cmd.Err
	}
	files := make([]uintptr, 0, 3+len(cmd.ExtraFiles))
	var null *os.File
	for _, s := range []any{cmd.Stdin, cmd.Stdout, cmd.Stderr} {
		f, ok := s.(*os.File)
		if s == nil || ok && f == nil {
			if null == nil {
				var err error
				if null, err = os.OpenFile(os.DevNull, os.O_RDWR, 0); err != nil {
					return nil, err
				}
				defer null.Close()
			}
			f = null
		} else if !ok {
			return nil, errors.New("procid.Start: stdin, stdout and stderr must be files")
		}
		files = append(files, f.Fd())
	}
	for _, f := range cmd.ExtraFiles {
		files = append(files, f.Fd())
	}
	var sys syscall.SysProcAttr
	if cmd.SysProcAttr != nil {
		sys = *cmd.SysProcAttr
	}
	pidfd := -1
	if pidfdWorks() {
		sys.PidFD = &pidfd
	}
	attr := &syscall.ProcAttr{Dir: cmd.Dir, Env: cmd.Environ(), Files: files, Sys: &sys}
	pid, _, err := syscall.StartProcess(cmd.Path, cmd.Args, attr)
	if err != nil {
		return nil, &os.PathError{Op: "fork/exec", Path: cmd.Path, Err: err}
	}
	c := &Child{Pid: pid}
	if sys.PidFD != nil && pidfd >= 0 {
		// Non-blocking, so that os.NewFile puts it in the poller.
		syscall.SetNonblock(pidfd, true)
		c.h = &procHandle{f: os.NewFile(uintptr(pidfd), "pidfd")}
	}
	return c, nil
}

// pidfdWorks reports whether this kernel gives pidfds (5.3 and later).
var pidfdWorks = sync.OnceValue(func() bool {
	fd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		return false
	}
	unix.Close(fd)
	return true
})

// Wait returns once the child has exited, reaped, with nil for an exit
// status of 0 and else an error worded as os/exec words it ("exit status
// 1", "signal: killed"). Call it once.
func (c *Child) Wait() error {
	if c.h != nil {
		c.h.wait() // in the poller: no thread held while it runs
		defer c.h.close()
	}
	var ws syscall.WaitStatus
	for {
		_, err := syscall.Wait4(c.Pid, &ws, 0, nil)
		if err == nil {
			break
		}
		if err != syscall.EINTR {
			return err
		}
	}
	return exitError(ws)
}

// exitError is ws as os/exec's Wait gives it: nil for exit status 0,
// else an error in os.ProcessState's words.
func exitError(ws syscall.WaitStatus) error {
	var s string
	switch {
	case ws.Exited():
		if ws.ExitStatus() == 0 {
			return nil
		}
		s = "exit status " + strconv.Itoa(ws.ExitStatus())
	case ws.Signaled():
		s = "signal: " + ws.Signal().String()
	default:
		s = "wait status " + strconv.Itoa(int(ws))
	}
	if ws.CoreDump() {
		s += " (core dumped)"
	}
	return errors.New(s)
}

// Signal sends sig to the child, through its pidfd where it has one: never
// to a process that took its pid after it was reaped.
func (c *Child) Signal(sig syscall.Signal) {
	if c.h != nil {
		c.h.signal(sig)
		return
	}
	syscall.Kill(c.Pid, sig)
}

// OnExit has f called, with what Wait would return, once the child has
// exited and been reaped: instead of Wait, not with it. A supervisor of
// 10,000 children needs no goroutine waiting for each (their stacks were
// 38 MB of a controller's memory): the children's pidfds are all in one
// epoll set, which one goroutine waits on in Go's poller.
func (c *Child) OnExit(f func(error)) {
	if c.h == nil || !reaperOf().add(c.h.f, func() { f(c.Wait()) }) {
		go func() { f(c.Wait()) }()
	}
}

// onExit has f called once p's process is gone, as Child.OnExit does,
// and closes p then; false if it cannot (no pidfd, or no epoll set): the
// caller waits itself.
func (p *procHandle) onExit(f func()) bool {
	return p.f != nil && reaperOf().add(p.f, func() { p.close(); f() })
}

// reaper waits for the exits of the processes given to OnExit, by their
// pidfds.
type reaper struct {
	ep   *pollset.Set // their pidfds
	mu   sync.Mutex
	kids map[int32]func() // by pidfd: what its exit calls
}

// reaperOf is this process's reaper, started on first use; nil where an
// epoll set cannot be made.
var reaperOf = sync.OnceValue(func() *reaper {
	ep, err := pollset.New()
	if err != nil {
		return nil
	}
	r := &reaper{ep: ep, kids: map[int32]func(){}}
	go r.run()
	return r
})

// add puts pidfd in the set, to call exited (in a goroutine of its own)
// once its process is gone; false if it could not.
func (r *reaper) add(pidfd *os.File, exited func()) bool {
	if r == nil {
		return false
	}
	rc, err := pidfd.SyscallConn()
	if err != nil {
		return false
	}
	var fd int32
	rc.Control(func(f uintptr) { fd = int32(f) })
	r.mu.Lock()
	r.kids[fd] = exited
	r.mu.Unlock()
	if r.ep.Add(int(fd), 0) != nil {
		r.mu.Lock()
		delete(r.kids, fd)
		r.mu.Unlock()
		return false
	}
	return true
}

// run reaps the children whose pidfds say they exited, for good.
func (r *reaper) run() {
	var evs [64]unix.EpollEvent
	for {
		n := r.ep.Wait(evs[:])
		if n == 0 {
			return // (it cannot be waited on)
		}
		for _, ev := range evs[:n] {
			r.mu.Lock()
			exited, ok := r.kids[ev.Fd]
			delete(r.kids, ev.Fd)
			r.mu.Unlock()
			if !ok {
				continue
			}
			// Out of the set before whatever exited does closes the
			// pidfd (a child's Wait reaps at once, and closes it).
			r.ep.Remove(int(ev.Fd))
			go exited()
		}
	}
}
