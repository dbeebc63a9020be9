package netplane

import (
	"fmt"
	"os"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/hostnet"
)

// on reports whether frames carry a virtio-net header.
// on says whether the port has the virtio-net header.
func (o Offloads) on() bool { return o.Checksum || o.TSO || o.Relayed }

// tunFlags are the TUN_F_* flags of the offloads.
func (o Offloads) tunFlags() uint {
	var f uint
	if o.Checksum || o.TSO || o.Relayed {
		f |= unix.TUN_F_CSUM
	}
	if o.TSO || o.Relayed {
		f |= unix.TUN_F_TSO4 | unix.TUN_F_TSO6
	}
	return f
}

// createTap creates TAP c.Name, marked hostnet.TapMark(c.Name), and returns its
// non-blocking fd. IFF_TUN_EXCL makes it fail when the name exists, so two
// helpers never share a TAP.
func createTap(c PortConfig) (int, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return -1, fmt.Errorf("opening /dev/net/tun: %w", err)
	}
	fail := func(what string, err error) (int, error) {
		unix.Close(fd)
		return -1, fmt.Errorf("creating TAP %s: %s: %w", c.Name, what, err)
	}
	ifr, err := unix.NewIfreq(c.Name)
	if err != nil {
		return fail("name", err)
	}
	ifr.SetUint16(tapFlags(c.Offloads) | unix.IFF_TUN_EXCL)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		if err == unix.EBUSY {
			return fail("TUNSETIFF", fmt.Errorf("%w (an interface of that name exists: is another helper running for this interface id?)", err))
		}
		return fail("TUNSETIFF", err)
	}
	if c.UID >= 0 {
		if err := unix.IoctlSetInt(fd, unix.TUNSETOWNER, c.UID); err != nil {
			return fail("TUNSETOWNER", err)
		}
	}
	if c.GID >= 0 {
		if err := unix.IoctlSetInt(fd, unix.TUNSETGROUP, c.GID); err != nil {
			return fail("TUNSETGROUP", err)
		}
	}
	if what, err := setOffloads(fd, c.Offloads); err != nil {
		return fail(what, err)
	}
	// Marked before it can outlive fd: until TUNSETPERSIST the TAP goes
	// with fd, however this process ends, and from then on it carries the
	// mark by which RemoveStaleTap, Sweep and the cleanup child know it as
	// this owner's. No crash leaves an unmarked TAP behind.
	if err := markTap(c.Name); err != nil {
		return fail("marking", err)
	}
	if c.Persist {
		if err := unix.IoctlSetInt(fd, unix.TUNSETPERSIST, 1); err != nil {
			return fail("TUNSETPERSIST", err)
		}
	}
	return fd, nil
}

// markTap gives TAP name its mark, hostnet.TapMark(name).
func markTap(name string) error {
	return setLink(name, false, nl.NewRtAttr(unix.IFLA_IFALIAS, []byte(hostnet.TapMark(name))))
}

// setLink changes link name with one request (RTM_SETLINK, which finds a
// link by name as well as by index): attrs, and the link up if up. (The
// kernel applies the flags before a master, IFLA_MASTER: a port made up
// and given its bridge in one request would be up off its bridge a
// moment.)
func setLink(name string, up bool, attrs ...*nl.RtAttr) error {
	req := nl.NewNetlinkRequest(unix.RTM_SETLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	if up {
		msg.Flags, msg.Change = unix.IFF_UP, unix.IFF_UP
	}
	req.AddData(msg)
	req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(name)))
	for _, a := range attrs {
		req.AddData(a)
	}
	_, err := req.Execute(unix.NETLINK_ROUTE, 0)
	return err
}

// openMacvtap opens the character device of macvtap mv (/dev/tap<ifindex>,
// which devtmpfs creates) as the VM's port: non-blocking, with the
// virtio-net header and offloads only if asked (a macvtap starts with the
// header on).
func openMacvtap(mv *netlink.Macvtap, o Offloads) (int, error) {
	path := fmt.Sprintf("/dev/tap%d", mv.Attrs().Index)
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return -1, fmt.Errorf("opening macvtap %s: %w (is devtmpfs mounted on /dev?)", mv.Attrs().Name, err)
	}
	fail := func(what string, err error) (int, error) {
		unix.Close(fd)
		return -1, fmt.Errorf("macvtap %s: %s: %w", mv.Attrs().Name, what, err)
	}
	ifr, err := unix.NewIfreq("")
	if err != nil {
		return fail("ifreq", err)
	}
	ifr.SetUint16(tapFlags(o))
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		return fail("TUNSETIFF", err)
	}
	if what, err := setOffloads(fd, o); err != nil {
		return fail(what, err)
	}
	return fd, nil
}

// tapFlags are the TUNSETIFF flags of a VM port: Ethernet frames without
// packet information, and the virtio-net header with offloads.
func tapFlags(o Offloads) uint16 {
	flags := uint16(unix.IFF_TAP | unix.IFF_NO_PI)
	if o.on() {
		flags |= unix.IFF_VNET_HDR
	}
	return flags
}

// setOffloads sets the virtio-net header's size and the offloads on a TAP
// or macvtap fd, if any are on. It returns the ioctl that failed.
func setOffloads(fd int, o Offloads) (string, error) {
	if !o.on() {
		return "", nil
	}
	if err := unix.IoctlSetPointerInt(fd, unix.TUNSETVNETHDRSZ, helperproto.VirtioNetHdrLen); err != nil {
		return "TUNSETVNETHDRSZ", err
	}
	// The header is little-endian (virtio 1.0's, which VMMs and the relay
	// write) on every host, big-endian ones too.
	if err := unix.IoctlSetPointerInt(fd, unix.TUNSETVNETLE, 1); err != nil {
		return "TUNSETVNETLE", err
	}
	if err := unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, int(o.tunFlags())); err != nil {
		return "TUNSETOFFLOAD", err
	}
	return "", nil
}

// OpenTAP opens the existing persistent TAP name (an `attach: tap` port,
// owned by the VM's user) for a VMM that takes a TAP descriptor, as qemu's
// `-netdev tap,fd=N`: blocking (the VMM sets its own flags), with the
// virtio-net header on, which qemu finds with TUNGETIFF and uses for the
// guest's offloads. It fails if the name is not a TAP, or another process
// holds it (a TAP without IFF_MULTI_QUEUE has one queue).
func OpenTAP(name string) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err == nil {
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
		err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("opening TAP %s: %w", name, err)
	}
	return os.NewFile(uintptr(fd), "tap-"+name), nil
}

// OpenVhostNet opens /dev/vhost-net for a VMM's `vhostfd=N`, so that the
// kernel moves the TAP's frames to and from the guest's virtio queues.
func OpenVhostNet() (*os.File, error) {
	f, err := os.OpenFile(vhostNetPath, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("vhost-net: %w", err)
	}
	return f, nil
}

// vhostNetPath is vhost-net's character device.
const vhostNetPath = "/dev/vhost-net"

// VhostNet reports whether this process can use vhost-net: the device is
// there and opens (a container's device rules may forbid it).
func VhostNet() bool {
	f, err := OpenVhostNet()
	if err != nil {
		return false
	}
	f.Close()
	return true
}
