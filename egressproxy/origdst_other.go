//go:build !linux

package egressproxy

import (
	"errors"
	"net"
	"net/netip"
)

// originalDst: redirects are Linux's (on macOS the helper is vmnet-helper).
func originalDst(*net.TCPConn) (netip.AddrPort, error) {
	return netip.AddrPort{}, errors.ErrUnsupported
}
