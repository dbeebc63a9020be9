package helperproto

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// SendBufferSize on Linux: bytes in flight, not the largest datagram
// (sockbuf.go).
const SendBufferSize = 256 << 10

// SetSocketBuffers sizes fd's buffers (sockbuf.go). With CAP_NET_ADMIN it
// forces them past net.core.wmem_max and rmem_max, as the helper does while
// it is still root; without, the kernel caps them there.
func SetSocketBuffers(fd int, offloads bool) error {
	for _, b := range []struct {
		name          string
		force, option int
		size          int
	}{
		{"SO_SNDBUF", unix.SO_SNDBUFFORCE, unix.SO_SNDBUF, SendBufferSize},
		{"SO_RCVBUF", unix.SO_RCVBUFFORCE, unix.SO_RCVBUF, receiveBuffer(offloads)},
	} {
		if unix.SetsockoptInt(fd, unix.SOL_SOCKET, b.force, b.size) == nil {
			continue
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, b.option, b.size); err != nil {
			return fmt.Errorf("setting %s: %w", b.name, err)
		}
	}
	return nil
}
