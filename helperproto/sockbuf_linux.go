package helperproto

import (
	"os"
	"strconv"
	"strings"
)

// SendBufferSize on Linux: bytes in flight, not the largest datagram
// (sockbuf.go).
const SendBufferSize = 256 << 10

// reportedFactor: Linux reports twice the size that was set (its
// bookkeeping's share).
const reportedFactor = 2

// SendBufferOnThisHost is the SO_SNDBUF that SetSocketBuffers leaves on a
// new socket on this host, as getsockopt reports it: SendBufferSize, at
// most net.core.wmem_max.
func SendBufferOnThisHost() (int, error) {
	limit, err := coreSysctl("wmem_max")
	return reportedFactor * min(SendBufferSize, limit), err
}

// coreSysctl reads /proc/sys/net/core/NAME.
func coreSysctl(name string) (int, error) {
	b, err := os.ReadFile("/proc/sys/net/core/" + name)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}
