package helperproto

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

func TestSetSocketBuffers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("forcing buffers past net.core.wmem_max needs root")
	}
	for _, offloads := range []bool{false, true} {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fds[0])
		defer unix.Close(fds[1])
		if err := SetSocketBuffers(fds[0], offloads); err != nil {
			t.Fatal(err)
		}
		rcv := receiveBuffer(offloads)
		// The kernel reports twice what was set (its bookkeeping's share).
		for _, o := range []struct {
			name   string
			option int
			want   int
		}{{"SO_SNDBUF", unix.SO_SNDBUF, 2 * SendBufferSize}, {"SO_RCVBUF", unix.SO_RCVBUF, 2 * rcv}} {
			if got, err := unix.GetsockoptInt(fds[0], unix.SOL_SOCKET, o.option); err != nil || got != o.want {
				t.Errorf("offloads %v: %s = %d (%v), want %d", offloads, o.name, got, err, o.want)
			}
		}
	}
}
