package helperproto

// SendBufferSize and ReceiveBufferSize are what SetSocketBuffers gives an
// end of the VM's datagram socket (the helper's own socket with --socket,
// the helper's end of an --fd socketpair, both ends of the socketpairs
// `vmnetctl run` makes); ReceiveBufferOffloaded replaces ReceiveBufferSize
// with offloads, whose datagrams are up to 64 KiB.
//
// vmnet-helper sets SO_SNDBUF to 65 KiB: on macOS a unix datagram socket's
// send buffer is the largest datagram it takes. On Linux it bounds the bytes
// a sender has in flight, its datagrams not yet read; at 65 KiB that is one
// 64 KiB segment with offloads, and every segment waited for the reader to
// wake (docs/performance.md: 256 KiB moved a third more with TSO at a
// quarter less CPU per GB). Linux has its own value (sockbuf_linux.go).
const (
	ReceiveBufferSize      = 4 << 20
	ReceiveBufferOffloaded = 8 << 20
)

// receiveBuffer is the receive buffer's size with or without offloads.
func receiveBuffer(offloads bool) int {
	if offloads {
		return ReceiveBufferOffloaded
	}
	return ReceiveBufferSize
}
