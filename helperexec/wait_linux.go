package helperexec

import (
	"time"

	"golang.org/x/sys/unix"
)

// WaitExit returns when the process of id is gone. A pidfd tells us without
// polling even though the process is not our child (it was adopted).
func (id ProcIdentity) WaitExit() {
	fd, err := unix.PidfdOpen(id.PID, 0)
	if err != nil {
		pollExit(id)
		return
	}
	defer unix.Close(fd)
	if !id.Alive() { // the pid may have been reused before we opened it
		return
	}
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n > 0 {
			return
		}
	}
}

func pollExit(id ProcIdentity) {
	for id.Alive() {
		time.Sleep(200 * time.Millisecond)
	}
}
