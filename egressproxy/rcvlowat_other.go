//go:build !linux

package egressproxy

import (
	"errors"
	"net"
)

// setRcvLowat is Linux's (copyBody wakes for each read elsewhere).
func setRcvLowat(*net.TCPConn, int) error { return errors.ErrUnsupported }
