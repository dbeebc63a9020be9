package helperproto

import (
	"testing"

	"golang.org/x/sys/unix"
)

// TestSetSocketBuffers: the sizes, as far as the host's limits allow, and
// a larger size its creator set is kept.
func TestSetSocketBuffers(t *testing.T) {
	for _, offloads := range []bool{false, true} {
		fds := socketpair(t)
		if err := SetSocketBuffers(fds[0], offloads); err != nil {
			t.Fatal(err)
		}
		for _, o := range []struct {
			name   string
			option int
			want   int
		}{
			{"SO_SNDBUF", unix.SO_SNDBUF, sendBuffer(t)},
			{"SO_RCVBUF", unix.SO_RCVBUF, reportedFactor * min(receiveBuffer(offloads), sysctl(t, "rmem_max"))},
		} {
			if got, err := unix.GetsockoptInt(fds[0], unix.SOL_SOCKET, o.option); err != nil || got != o.want {
				t.Errorf("offloads %v: %s = %d (%v), want %d", offloads, o.name, got, err, o.want)
			}
		}
	}
	fds := socketpair(t)
	if err := unix.SetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 4*SendBufferSize); err != nil {
		t.Skipf("a larger buffer than ours needs root to force: %v", err)
	}
	SetSocketBuffers(fds[0], false)
	if got, _ := unix.GetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_SNDBUF); got != reportedFactor*4*SendBufferSize {
		t.Errorf("SO_SNDBUF of %d was lowered to %d", reportedFactor*4*SendBufferSize, got)
	}
}

func socketpair(t *testing.T) [2]int {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
	return [2]int{fds[0], fds[1]}
}

func sendBuffer(t *testing.T) int {
	n, err := SendBufferOnThisHost()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func sysctl(t *testing.T, name string) int {
	n, err := coreSysctl(name)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
