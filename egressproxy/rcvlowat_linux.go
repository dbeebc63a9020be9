package egressproxy

import (
	"net"
	"syscall"
)

// setRcvLowat sets c's SO_RCVLOWAT. Where the kernel grows the receive
// buffer for it, older kernels also clamp the window to n (tcp_set_rcvlowat),
// which would cap the connection's rate for good: a clamp it lowered is
// put back.
func setRcvLowat(c *net.TCPConn, n int) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		clamp, cerr := syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_WINDOW_CLAMP)
		if serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT, n); serr != nil || cerr != nil {
			return
		}
		if now, err := syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_WINDOW_CLAMP); err == nil && now < clamp {
			// (Its rate, not the mark, is at stake: the mark is set.)
			syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_WINDOW_CLAMP, clamp)
		}
	}); err != nil {
		return err
	}
	return serr
}
