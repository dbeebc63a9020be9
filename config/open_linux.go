package config

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// openRegular opens path for reading if it is a regular file, and refuses
// anything else without opening it: a path is first opened with O_PATH,
// which opens no device (a symbolic link to /dev/watchdog would arm it,
// root reading a user's file), and only a regular file is then opened for
// reading, through that descriptor (the same file, not the path again).
func openRegular(path string) (*os.File, os.FileInfo, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, nil, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, nil, fmt.Errorf("%s is not a regular file (%s); vmnetctl reads its input from regular files only", path, fileType(modeOf(st.Mode)))
	}
	f, err := os.Open("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return nil, nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, fi, nil
}

// modeOf is a stat mode's file type as an fs.FileMode.
func modeOf(m uint32) os.FileMode {
	switch m & unix.S_IFMT {
	case unix.S_IFDIR:
		return os.ModeDir
	case unix.S_IFCHR:
		return os.ModeDevice | os.ModeCharDevice
	case unix.S_IFBLK:
		return os.ModeDevice
	case unix.S_IFIFO:
		return os.ModeNamedPipe
	case unix.S_IFSOCK:
		return os.ModeSocket
	}
	return os.ModeIrregular
}
