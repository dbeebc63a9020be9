// Package dirwatch tells which files of a directory were written since a
// caller last looked, by inotify, so that a supervisor of thousands of
// files reads the few that moved instead of asking every one. What it
// cannot tell (no watch yet, the kernel's queue overflowed, the
// directory went) it reports as everything having moved.
package dirwatch

import (
	"bytes"
	"errors"
	"iter"
	"maps"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Watch learns from inotify which files of its directory were written:
// at 10,000 idle helpers the controller's log check, which stat'ed their
// 20,000 logs and stats files every 10 s, was 40% of its idle CPU. A
// caller drains what the kernel queued, looks at each file named (or at
// every file if the watch cannot tell), then takes: what it looked at is
// forgotten. Not safe for concurrent use.
type Watch struct {
	dir   string
	fd    int // -1: not watching
	buf   []byte
	names map[string]bool // base names written since the last take
	all   bool            // unknown: take says everything moved
}

// maxMovedNames bounds what a watch keeps between two checks; past it,
// everything counts as moved.
const maxMovedNames = 1 << 16

// New watches dir (made when first drained).
func New(dir string) *Watch {
	return &Watch{dir: dir, fd: -1, names: map[string]bool{}, all: true}
}

// Drain reads the events queued since the last drain (a watch made here
// counts everything as moved once).
func (w *Watch) Drain() {
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
				w.Close() // the directory went: watch it again next time
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

// Moved says whether the file at path (or of that name) may have been
// written since the last take: drained events name it, or the watch
// cannot tell.
func (w *Watch) Moved(path string) bool {
	return w == nil || w.all || path != "" && w.names[filepath.Base(path)]
}

// Tells says whether the watch knows what moved since the last take.
func (w *Watch) Tells() bool { return w != nil && !w.all }

// Watching says whether the watch will know what moves after a take: it
// watches its directory (a caller that is to trust its silence then
// must look at every file of it now, if it could not tell).
func (w *Watch) Watching() bool { return w != nil && w.fd >= 0 }

// Names are the names of the files that drained events named since the
// last take (created, written, renamed or removed); meaningful only when
// the watch tells.
func (w *Watch) Names() iter.Seq[string] {
	if w == nil {
		return maps.Keys(map[string]bool(nil))
	}
	return maps.Keys(w.names)
}

// Unknown makes the watch tell nothing until the next take, as an
// overflow of the kernel's queue does.
func (w *Watch) Unknown() {
	if w != nil {
		w.all = true
	}
}

// Take forgets what was drained: the caller has looked at every file it
// named (and at every file, if it could not tell).
func (w *Watch) Take() {
	if w == nil {
		return
	}
	clear(w.names)
	w.all = w.fd < 0
}

// Close stops watching (Drain watches again).
func (w *Watch) Close() {
	if w != nil && w.fd >= 0 {
		unix.Close(w.fd)
		w.fd = -1
	}
}
