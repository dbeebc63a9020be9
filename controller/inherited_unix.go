//go:build unix

package controller

import (
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// closeInherited closes the descriptors from 3 up that this process
// inherited open across its exec: every one Go opens is close-on-exec,
// so one that is not came from whoever started it (a shell's, a CI
// runner's pipe). A daemon that kept them would hold them for as long as
// it and every helper it starts run: a pipe whose reader waits for its
// end (a CI step's, `$(vmnetctl up)`'s) would wait for `down`.
func closeInherited() {
	dir := "/proc/self/fd"
	if _, err := os.Stat(dir); err != nil {
		dir = "/dev/fd"
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd < 3 {
			continue
		}
		if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil && flags&unix.FD_CLOEXEC == 0 {
			unix.Close(fd)
		}
	}
}
