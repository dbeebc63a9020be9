package controller

import (
	"bytes"
	"errors"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
)

// fileWatch learns from inotify which of the helpers' logs and stats
// files were written, so that the periodic log check and a scrape look
// only at those: at 10,000 idle helpers the check's 20,000 lstat calls
// every 10 s were 40% of an idle controller's CPU. What it cannot tell
// (no watch yet, the kernel's queue overflowed, the directory went) it
// reports as everything having moved, and the callers stat every file as
// before.
type fileWatch struct {
	dir   string
	fd    int // -1: not watching
	buf   []byte
	names map[string]bool // base names written since the last take
	all   bool            // unknown: take says everything moved
}

// maxMovedNames bounds what a watch keeps between two checks; past it,
// everything counts as moved.
const maxMovedNames = 1 << 16

func newFileWatch(dir string) *fileWatch {
	return &fileWatch{dir: dir, fd: -1, names: map[string]bool{}, all: true}
}

// drain reads the events queued since the last drain into w.names (a
// watch made here counts everything as moved once).
func (w *fileWatch) drain() {
	if w == nil {
		return
	}
	if w.fd < 0 {
		w.all = true
		fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
		if err != nil {
			return
		}
		const mask = unix.IN_MODIFY | unix.IN_CLOSE_WRITE | unix.IN_CREATE | unix.IN_DELETE | unix.IN_MOVED_TO |
			unix.IN_MOVED_FROM | unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR
		if _, err := unix.InotifyAddWatch(fd, w.dir, mask); err != nil {
			unix.Close(fd) // (no helpers' directory yet: next time)
			return
		}
		w.fd = fd
		w.buf = make([]byte, 64<<10)
		return
	}
	for {
		n, err := unix.Read(w.fd, w.buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n <= 0 {
			return // EAGAIN: nothing more queued
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&w.buf[off]))
			name := w.buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			off += unix.SizeofInotifyEvent + int(ev.Len)
			switch {
			case ev.Mask&unix.IN_Q_OVERFLOW != 0:
				w.all = true
			case ev.Mask&(unix.IN_IGNORED|unix.IN_DELETE_SELF|unix.IN_MOVE_SELF) != 0:
				w.close() // the directory went: watch it again next time
				w.all = true
				return
			default:
				if i := bytes.IndexByte(name, 0); i >= 0 {
					name = name[:i]
				}
				if len(w.names) >= maxMovedNames {
					w.all = true
				} else if !w.all {
					w.names[string(name)] = true
				}
			}
		}
	}
}

// moved says whether the file at path may have been written since the
// last take: drained events name it, or the watch cannot tell.
func (w *fileWatch) moved(path string) bool {
	return w == nil || w.all || path != "" && w.names[filepath.Base(path)]
}

// tells says whether the watch knows what moved since the last take.
func (w *fileWatch) tells() bool { return w != nil && !w.all }

// take forgets what was drained: the caller has looked at every file it
// named (and at every file, if it could not tell).
func (w *fileWatch) take() {
	if w == nil {
		return
	}
	clear(w.names)
	w.all = w.fd < 0
}

func (w *fileWatch) close() {
	if w != nil && w.fd >= 0 {
		unix.Close(w.fd)
		w.fd = -1
	}
}
