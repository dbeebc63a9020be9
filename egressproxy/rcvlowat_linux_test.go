package egressproxy

import (
	"net"
	"syscall"
	"testing"
)

// TestRcvLowatKeepsWindow: where the kernel grows a socket's receive
// buffer for its low-water mark, older kernels set the
// window's clamp to the mark (tcp_set_rcvlowat), which would cap the
// upload's rate for good; setRcvLowat puts the clamp back. (The kernel
// this was written on only raises the clamp: here it passes either way.)
func TestRcvLowatKeepsWindow(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dialed, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer dialed.Close()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tc := c.(*net.TCPConn)
	rc, _ := tc.SyscallConn()
	clamp := func() (v int) {
		rc.Control(func(fd uintptr) { v, _ = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_WINDOW_CLAMP) })
		return v
	}
	const wide = 4 << 20 // as autotuning leaves a fast connection's
	rc.Control(func(fd uintptr) {
		if err := syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_WINDOW_CLAMP, wide); err != nil {
			t.Fatal(err)
		}
	})
	// A mark past half the buffer: the kernel grows the buffer for it.
	if err := setRcvLowat(tc, 256<<10); err != nil {
		t.Fatal(err)
	}
	if got := clamp(); got != wide {
		t.Errorf("the window's clamp is %d after the mark, want %d as before", got, wide)
	}
}
