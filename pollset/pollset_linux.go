package pollset

import (
	"os"

	"golang.org/x/sys/unix"
)

// Set is an epoll set of descriptors, each watched for reading.
type Set struct {
	f *os.File // in Go's poller
}

// New makes an empty set.
func New() (*Set, error) {
	fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	unix.SetNonblock(fd, true) // so that os.NewFile puts it in the poller
	return &Set{f: os.NewFile(uintptr(fd), "epoll set")}, nil
}

// Add watches fd for reading (or its end); its events carry fd and tag.
func (s *Set) Add(fd int, tag int32) error {
	var err error
	s.control(func(ep int) {
		err = unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd), Pad: tag})
	})
	return err
}

// Remove stops watching fd (call it before fd is closed).
func (s *Set) Remove(fd int) {
	s.control(func(ep int) { unix.EpollCtl(ep, unix.EPOLL_CTL_DEL, fd, nil) })
}

func (s *Set) control(f func(ep int)) {
	if rc, err := s.f.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) { f(int(fd)) })
	}
}

// Wait waits, in Go's poller, until some descriptors are ready, and puts
// their events in evs: how many (0 if the set cannot be waited on).
func (s *Set) Wait(evs []unix.EpollEvent) int {
	rc, err := s.f.SyscallConn()
	if err != nil {
		return 0
	}
	n := 0
	rc.Read(func(fd uintptr) bool {
		var err error
		n, err = unix.EpollWait(int(fd), evs, 0)
		return n > 0 || err != nil && err != unix.EINTR
	})
	return max(n, 0)
}
