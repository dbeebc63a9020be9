//go:build unix

package helperproto

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// SetSocketBuffers raises fd's buffers to SendBufferSize and the receive
// buffer for offloads (sockbuf.go), and never lowers what fd's creator set.
// The kernel caps them at net.core.wmem_max and rmem_max; nothing forces
// them past the host's limits. It tries both and returns the first error,
// which callers only warn of, as vmnet-helper does: the kernel's sizes
// work, only slower.
func SetSocketBuffers(fd int, offloads bool) error {
	var first error
	for _, b := range []struct {
		name         string
		option, size int
	}{
		{"SO_SNDBUF", unix.SO_SNDBUF, SendBufferSize},
		{"SO_RCVBUF", unix.SO_RCVBUF, receiveBuffer(offloads)},
	} {
		if cur, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, b.option); err == nil && cur >= reportedFactor*b.size {
			continue
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, b.option, b.size); err != nil && first == nil {
			first = fmt.Errorf("setting %s: %w", b.name, err)
		}
	}
	return first
}
