package helperexec

import (
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// fileWait wakes a waiter when a file is written or closed after a write
// (inotify), so that a helper's ready line is read when it is written, not
// at the next look of a poll: a start then waits no longer than it must,
// and a fleet's starts do not wake a hundred times a second each.
type fileWait struct {
	f     *os.File
	woken atomic.Bool
}

// newFileWait watches path; nil if it cannot (the caller polls).
func newFileWait(path string) *fileWait {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil
	}
	if _, err := unix.InotifyAddWatch(fd, path, unix.IN_MODIFY|unix.IN_CLOSE_WRITE); err != nil {
		unix.Close(fd)
		return nil
	}
	return &fileWait{f: os.NewFile(uintptr(fd), "inotify "+path)} // (non-blocking: in Go's poller)
}

// wait returns once the file was written since the last wait, or after
// at most d, or at once after wake.
func (w *fileWait) wait(d time.Duration) {
	var buf [4096]byte
	w.f.SetReadDeadline(time.Now().Add(d))
	if w.woken.Load() {
		return
	}
	w.f.Read(buf[:]) // the events themselves do not matter: the file is read again
}

// wake ends the waits, this one and those after: the helper has exited
// (its file's close woke the wait before its exit was known).
func (w *fileWait) wake() {
	if w != nil {
		w.woken.Store(true)
		w.f.SetReadDeadline(time.Now())
	}
}

func (w *fileWait) close() {
	if w != nil {
		w.f.Close()
	}
}
