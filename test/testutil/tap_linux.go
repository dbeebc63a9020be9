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

// OpenOffloadTAP is OpenTAP with the 12-byte virtio-net header
// (IFF_VNET_HDR, little-endian) and checksum offload and TSO on: the NIC
// of a guest whose driver has them, as a VMM gives it.
func OpenOffloadTAP(name string) (int, error) {
	return openVnetTAP(name, unix.TUN_F_CSUM|unix.TUN_F_TSO4|unix.TUN_F_TSO6)
}

// OpenVnetTAP is OpenTAP with the 12-byte virtio-net header and no
// offloads: what it reads are frames of at most the MTU behind a header
// that asks for nothing, and what is written to it may be a TCP packet
// the header asks it to cut (TSO), as a guest's GRO hands its stack.
func OpenVnetTAP(name string) (int, error) { return openVnetTAP(name, 0) }

func openVnetTAP(name string, offloads int) (int, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	step := "TUNSETIFF"
	ifr, err := unix.NewIfreq(name)
	if err == nil {
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
		err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
	}
	if err == nil {
		step, err = "TUNSETVNETHDRSZ", unix.IoctlSetPointerInt(fd, unix.TUNSETVNETHDRSZ, 12)
	}
	if err == nil {
		step, err = "TUNSETVNETLE", unix.IoctlSetPointerInt(fd, unix.TUNSETVNETLE, 1)
	}
	if err == nil {
		step, err = "TUNSETOFFLOAD", unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, offloads)
	}
	if err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("TAP %s: %s: %w", name, step, err)
	}
	return fd, nil
}
