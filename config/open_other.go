//go:build !linux

package config

import (
	"fmt"
	"os"
	"syscall"
)

// openRegular opens path for reading and refuses it unless it is a
// regular file (O_NONBLOCK: a FIFO with no writer does not block).
func openRegular(path string) (*os.File, os.FileInfo, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, nil, fmt.Errorf("%s is not a regular file (%s); vmnetctl reads its input from regular files only", path, fileType(fi.Mode()))
	}
	return f, fi, nil
}
