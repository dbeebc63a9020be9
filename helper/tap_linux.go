package helper

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	gosignal "os/signal"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/netplane"
)

// networkBridge returns the bridge of network n, checking that vmnetctl's
// data plane runs it: the bridge exists, carries vmnetctl's mark and is up.
// Without that the VM would get no DHCP, and the helper says so instead of
// running on a dead network.
func networkBridge(n *api.Network) (netlink.Link, error) {
	if n.Mode == api.ModeBridged {
		return bridgedBridge(n)
	}
	name := n.Bridge()
	if name == "" {
		return nil, fmt.Errorf("network %q is %s, which the helper cannot join", n.ID, n.Mode)
	}
	notUp := fmt.Errorf("network %q is not up (run `vmnetctl up`)", n.ID)
	br, err := netlink.LinkByName(name)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return nil, fmt.Errorf("%w: bridge %s does not exist", notUp, name)
	}
	if err != nil {
		return nil, fmt.Errorf("network %q: bridge %s: %w", n.ID, name, err)
	}
	if _, ok := br.(*netlink.Bridge); !ok {
		return nil, fmt.Errorf("network %q: %s is a %s, not vmnetctl's bridge", n.ID, name, br.Type())
	}
	if mark := netplane.Mark(n.ID); br.Attrs().Alias != mark {
		if strings.HasPrefix(br.Attrs().Alias, mark[:strings.Index(mark, ":")+1]) {
			return nil, fmt.Errorf("network %q: bridge %s belongs to another vmnetctl network (alias %q)", n.ID, name, br.Attrs().Alias)
		}
		return nil, fmt.Errorf("network %q: bridge %s is not vmnetctl's (its alias is %q, not %q)", n.ID, name, br.Attrs().Alias, mark)
	}
	if br.Attrs().Flags&net.FlagUp == 0 {
		return nil, fmt.Errorf("%w: bridge %s is down", notUp, name)
	}
	return br, nil
}

// tapConfig says how to create a TAP.
type tapConfig struct {
	name     string
	uid, gid int  // owner, -1 for none
	offloads uint // TUN_F_* flags; nonzero puts a virtio-net header on frames
	persist  bool // survives closing the fd (--attach tap)
}

// createTap creates a TAP and returns its non-blocking fd. IFF_TUN_EXCL
// makes it fail when the name exists, so two helpers never share a TAP.
func createTap(c tapConfig) (int, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return -1, fmt.Errorf("opening /dev/net/tun: %w", err)
	}
	fail := func(what string, err error) (int, error) {
		unix.Close(fd)
		return -1, fmt.Errorf("creating TAP %s: %s: %w", c.name, what, err)
	}
	ifr, err := unix.NewIfreq(c.name)
	if err != nil {
		return fail("name", err)
	}
	flags := uint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_TUN_EXCL)
	if c.offloads != 0 {
		flags |= unix.IFF_VNET_HDR
	}
	ifr.SetUint16(flags)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		if err == unix.EBUSY {
			return fail("TUNSETIFF", fmt.Errorf("%w (an interface of that name exists: is another helper running for this interface id?)", err))
		}
		return fail("TUNSETIFF", err)
	}
	if c.uid >= 0 {
		if err := unix.IoctlSetInt(fd, unix.TUNSETOWNER, c.uid); err != nil {
			return fail("TUNSETOWNER", err)
		}
	}
	if c.gid >= 0 {
		if err := unix.IoctlSetInt(fd, unix.TUNSETGROUP, c.gid); err != nil {
			return fail("TUNSETGROUP", err)
		}
	}
	if c.offloads != 0 {
		if err := unix.IoctlSetPointerInt(fd, unix.TUNSETVNETHDRSZ, VirtioNetHdrLen); err != nil {
			return fail("TUNSETVNETHDRSZ", err)
		}
		if err := unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, int(c.offloads)); err != nil {
			return fail("TUNSETOFFLOAD", err)
		}
	}
	if c.persist {
		if err := unix.IoctlSetInt(fd, unix.TUNSETPERSIST, 1); err != nil {
			return fail("TUNSETPERSIST", err)
		}
	}
	return fd, nil
}

// offloadFlags are the TUN_F_* flags for the options.
func offloadFlags(o *Options) uint {
	var f uint
	if o.ChecksumOffload || o.TSO {
		f |= unix.TUN_F_CSUM
	}
	if o.TSO {
		f |= unix.TUN_F_TSO4 | unix.TUN_F_TSO6
	}
	return f
}

// attachTap puts the TAP on the bridge: netplane owns what a port looks like.
func attachTap(name, bridge string, isolated bool) (netlink.Link, error) {
	link, err := netlink.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("TAP %s: %w", name, err)
	}
	// Marked, so that the controller can remove it if this helper and its
	// cleanup child are both killed (a persistent TAP would otherwise block
	// the next helper: TAPs are created exclusively).
	if err := netlink.LinkSetAlias(link, netplane.TapMark(name)); err != nil {
		return nil, fmt.Errorf("marking TAP %s: %w", name, err)
	}
	if err := netplane.AttachPort(bridge, link, isolated); err != nil {
		return nil, err
	}
	// Read it again: AttachPort changed its MTU and state.
	return netlink.LinkByName(name)
}

// deleteLink removes a link by name; a link already gone is not an error.
func deleteLink(name string) error {
	link, err := netlink.LinkByName(name)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return nil
	}
	if err != nil {
		return err
	}
	return netlink.LinkDel(link)
}

// ListSharedInterfaces returns the host interfaces a bridged network could
// use: bridges that are not vmnetctl's, and physical Ethernet devices that
// are not a bridge port (the helper joins only bridges so far: bridge those
// first).
func ListSharedInterfaces() ([]string, error) {
	links, err := netlink.LinkList()
	if errors.Is(err, netlink.ErrDumpInterrupted) {
		links, err = netlink.LinkList()
	}
	if err != nil {
		return nil, fmt.Errorf("listing interfaces: %w", err)
	}
	var names []string
	for _, l := range links {
		a := l.Attrs()
		if _, ok := l.(*netlink.Bridge); ok {
			if !strings.HasPrefix(a.Alias, "vmnetctl:") && a.MasterIndex == 0 {
				names = append(names, a.Name)
			}
			continue
		}
		if l.Type() != "device" || a.Flags&net.FlagLoopback != 0 || a.MasterIndex != 0 || len(a.HardwareAddr) != 6 {
			continue
		}
		// Virtual devices without a driver type still show as "device";
		// a physical NIC has a device directory in sysfs.
		if _, err := os.Stat("/sys/class/net/" + a.Name + "/device"); err != nil {
			continue
		}
		names = append(names, a.Name)
	}
	return names, nil
}

// errNeedsMacvtap: the VM joins a bridged network through a macvtap on the
// host interface rather than a TAP on a bridge.
var errNeedsMacvtap = errors.New("the VM's port is a macvtap")

// bridgedBridge is the bridge a bridged network's VMs join: the network's
// host interface, which must be a bridge that is up. The data plane creates
// nothing for a bridged network, so there is no mark to check.
func bridgedBridge(n *api.Network) (netlink.Link, error) {
	name, err := netplane.PortBridge(n)
	if err != nil {
		return nil, err
	}
	if name == "" {
		return nil, fmt.Errorf("network %q: interface %s is not a bridge: %w", n.ID, n.Interface, errNeedsMacvtap)
	}
	br, err := netlink.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("network %q: bridge %s: %w", n.ID, name, err)
	}
	if br.Attrs().Flags&net.FlagUp == 0 {
		return nil, fmt.Errorf("network %q: bridge %s is down", n.ID, name)
	}
	return br, nil
}

// openMacvtap opens the character device of macvtap mv (/dev/tap<ifindex>,
// which devtmpfs creates) as the VM's port: non-blocking, with the
// virtio-net header and offloads only if asked (a macvtap starts with the
// header on).
func openMacvtap(mv *netlink.Macvtap, offloads uint) (int, error) {
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
	flags := uint16(unix.IFF_TAP | unix.IFF_NO_PI)
	if offloads != 0 {
		flags |= unix.IFF_VNET_HDR
	}
	ifr.SetUint16(flags)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		return fail("TUNSETIFF", err)
	}
	if offloads != 0 {
		if err := unix.IoctlSetPointerInt(fd, unix.TUNSETVNETHDRSZ, VirtioNetHdrLen); err != nil {
			return fail("TUNSETVNETHDRSZ", err)
		}
		if err := unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, int(offloads)); err != nil {
			return fail("TUNSETOFFLOAD", err)
		}
	}
	return fd, nil
}

// DeleteLinkFlag is the hidden `vmnetctl helper` flag that runs the child
// deleteOnExit starts.
const DeleteLinkFlag = "delete-link-on-eof"

// deleteOnExit starts a child, still root, that deletes link name when the
// helper's end of a pipe to it closes: when the helper returns, exits or is
// killed. The returned func closes the pipe and waits for the deletion.
func deleteOnExit(name string, stderr io.Writer) (func(), error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding the helper's executable: %w", err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "helper", "--"+DeleteLinkFlag, name)
	cmd.Stdin = r
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("starting the child that deletes %s: %w", name, err)
	}
	r.Close()
	return func() {
		w.Close()
		cmd.Wait()
	}, nil
}

// DeleteLinkOnEOF is that child: it ignores the signals its process group
// gets, waits for EOF on r, then deletes link name.
func DeleteLinkOnEOF(name string, r io.Reader) error {
	gosignal.Ignore(syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	io.Copy(io.Discard, r)
	if err := deleteLink(name); err != nil {
		return fmt.Errorf("deleting %s: %w", name, err)
	}
	return nil
}
