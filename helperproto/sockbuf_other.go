//go:build !linux

package helperproto

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// SendBufferSize elsewhere is vmnet-helper's: on macOS, the largest
// datagram a unix datagram socket sends (sockbuf.go).
const SendBufferSize = 65 << 10

// SetSocketBuffers sizes fd's buffers as vmnet-helper does (sockbuf.go).
func SetSocketBuffers(fd int, offloads bool) error {
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, SendBufferSize); err != nil {
		return fmt.Errorf("setting SO_SNDBUF: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, receiveBuffer(offloads)); err != nil {
		return fmt.Errorf("setting SO_RCVBUF: %w", err)
	}
	return nil
}
