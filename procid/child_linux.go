package procid

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
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
