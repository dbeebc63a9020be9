//go:build unix && !linux

package helperproto

// SendBufferSize elsewhere is vmnet-helper's: on macOS, the largest
// datagram a unix datagram socket sends (sockbuf.go).
const SendBufferSize = 65 << 10

// reportedFactor: the size reads back as set.
const reportedFactor = 1
