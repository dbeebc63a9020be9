package testutil

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// OpenTAP opens the TAP named name (Ethernet frames, no packet
// information), creating it if it does not exist, in the network namespace
// of the calling thread (inside NS.Do for a namespace of a test's own),
// as a VMM opens its NIC's TAP. The caller closes the fd.
func OpenTAP(name string) (int, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	ifr, err := unix.NewIfreq(name)
	if err == nil {
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
		err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
	}
	if err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("TAP %s: TUNSETIFF: %w", name, err)
	}
	return fd, nil
}
