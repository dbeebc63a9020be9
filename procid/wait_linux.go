package procid

import (
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// procHandle is one process, whatever becomes of its pid: a pidfd, or
// where the kernel has none (before 5.3) its identity.
type procHandle struct {
	id Identity
	f  *os.File // the pidfd; nil without
}

// open returns a handle on id's process if it is still the recorded one.
func (id Identity) open() (*procHandle, bool) {
	fd, err := unix.PidfdOpen(id.PID, unix.PIDFD_NONBLOCK)
	if err != nil {
		return &procHandle{id: id}, id.Alive()
	}
	if !id.Alive() { // the pid may have been reused before we opened it
		unix.Close(fd)
		return nil, false
	}
	return &procHandle{id: id, f: os.NewFile(uintptr(fd), "pidfd")}, true
}

func (p *procHandle) signal(sig syscall.Signal) {
	if p.f == nil {
		if p.id.Alive() {
			syscall.Kill(p.id.PID, sig)
		}
		return
	}
	if rc, err := p.f.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) { unix.PidfdSendSignal(int(fd), sig, nil, 0) })
	}
}

// wait returns when the process is gone. A pidfd tells even though the
// process is not our child (it was adopted), and it goes into Go's network
// poller, so a waiting goroutine holds no OS thread: one epoll thread waits
// for every helper, however many there are (a blocking poll or wait4 per
// helper would hold one thread each).
func (p *procHandle) wait() {
	if p.f == nil {
		pollExit(p.id)
		return
	}
	rc, err := p.f.SyscallConn()
	if err != nil {
		return
	}
	rc.Read(pidfdReadable)
}

func (p *procHandle) close() {
	if p.f != nil {
		p.f.Close()
	}
}

// pidfdReadable is a RawConn.Read callback: true once the pidfd is
// readable (its process exited).
func pidfdReadable(fd uintptr) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(p, 0)
	return err != nil && err != unix.EINTR || n > 0
}

// WaitGone returns when process pid has exited (a child not yet reaped
// counts as exited), without reaping it: the caller's exec.Cmd.Wait then
// returns at once.
func WaitGone(pid int) {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return // the caller's Wait blocks instead
	}
	p := &procHandle{f: os.NewFile(uintptr(fd), "pidfd")}
	defer p.close()
	p.wait()
}
