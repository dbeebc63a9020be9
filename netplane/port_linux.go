package netplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/guard"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/procid"
)

// Port is a VM's port that CreatePort made: a TAP on a bridge, or a macvtap.
type Port struct {
	Name string
	// FD reads and writes the VM's frames (non-blocking); -1 once closed.
	FD int
	// MTU is the port's: the bridge's, or the macvtap's interface's.
	MTU int
	// Bridge is the bridge a TAP joined; empty for a macvtap.
	Bridge string
	// Macvtap tells a macvtap from a TAP.
	Macvtap bool
	// Index is the link's interface index, which its guard is keyed by.
	Index uint32
	// reaper ends the cleanup child and waits for the deletion, or only
	// has the child reaped when it exits.
	reaper func(wait bool)
	// cleanupFD is this end of the pipe to the cleanup child, cleanupPID
	// the child, cleanupDone the read end of the pipe that is its stdout.
	cleanupFD, cleanupPID int
	cleanupDone           *os.File
}

// CleanupFD is the descriptor of the port's end of the pipe to its cleanup
// child, -1 if it has none: a process that inherits it and keeps it open
// keeps the port (the child deletes it once every holder has closed it).
func (p *Port) CleanupFD() int {
	if p.reaper == nil {
		return -1
	}
	return p.cleanupFD
}

// CleanupDoneFD is the read end of a pipe whose write end only the
// port's cleanup child holds (its stdout), -1 if it has none: it reads
// EOF once the child has exited, having deleted the port or not. A
// process that is not the child's parent waits for it so (relay.Hold).
func (p *Port) CleanupDoneFD() int {
	if p.reaper == nil || p.cleanupDone == nil {
		return -1
	}
	return int(p.cleanupDone.Fd())
}

// CleanupPID is the port's cleanup child, 0 if it has none: whoever holds
// CleanupFD last waits for it, so that the port is gone before it ends (a
// helper started again at once would take over the port the child is
// about to delete).
func (p *Port) CleanupPID() int {
	if p.reaper == nil {
		return 0
	}
	return p.cleanupPID
}

// CreatePort makes the VM's port on network n as c says and returns it
// open: on a network with a bridge (NetworkBridge: shared, host, bridged on
// a bridge) a TAP owned by c.UID and c.GID, marked hostnet.TapMark(c.Name), guarded
// on a shared or host network (GuardPort, unless c.NoSpoofCheck) and
// attached to the bridge as AttachPort attaches a link (joinBridge); on a bridged network whose
// interface is not a bridge a macvtap (CreateMacvtap), opened through its
// character device. The network must be up. A port that outlives its fd (a
// macvtap, a persistent TAP) is deleted by the child c.Cleanup gives when
// the caller ends, however it ends. Close releases the port.
func CreatePort(n *api.Network, c PortConfig) (*Port, error) {
	br, err := NetworkBridge(n)
	macvtap := errors.Is(err, ErrMacvtapPort)
	switch {
	case err != nil && !macvtap:
		return nil, err
	case macvtap && c.Persist:
		return nil, fmt.Errorf("%w; a persistent TAP needs a bridge", err)
	case macvtap && c.Isolated:
		return nil, fmt.Errorf("%w; isolation needs a bridge (bridge mode macvtaps always reach each other)", err)
	}
	p := &Port{Name: c.Name, FD: -1}
	if macvtap {
		err = p.createMacvtap(n, c)
	} else {
		err = p.createTap(n, br, c)
	}
	if err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// createTap makes p a TAP on bridge br of network n.
func (p *Port) createTap(n *api.Network, br *netlink.Bridge, c PortConfig) error {
	var err error
	if p.FD, err = createTap(c); errors.Is(err, unix.EBUSY) {
		// A link of the name: a TAP of this state dir's that a killed
		// helper left goes, another's is a clear error, never taken over.
		if err = tapClash(c.Name); err == nil {
			p.FD, err = createTap(c)
		}
	}
	if err != nil {
		return err
	}
	if p.Index, err = hostnet.LinkIndex(c.Name); err == nil && p.Index == 0 {
		err = unix.ENODEV
	}
	if err != nil {
		if c.Persist {
			deleteLink(c.Name)
		}
		return fmt.Errorf("TAP %s: %w", c.Name, err)
	}
	if c.Persist {
		// Like a macvtap, a persistent TAP outlives the caller's fd and
		// its root privileges: the child deletes it when the caller ends,
		// even while a VMM still holds it, and even on kill -9.
		if err := p.deleteOnExit(c); err != nil {
			deleteLink(c.Name)
			return err
		}
	}
	// The guard is in place before the TAP joins the bridge: no frame of
	// it goes unchecked.
	if c.NoSpoofCheck {
		err = guard.RemovePort(context.TODO(), n, c.Name)
	} else if c.GuardKept {
		err = guard.AddPortKept(context.TODO(), n, c.Name, c.VMMAC)
	} else {
		err = guard.AddPort(context.TODO(), n, c.Name, c.VMMAC)
	}
	if err != nil {
		return err
	}
	if err := attachTap(c.Name, p.Index, br, c.Isolated); err != nil {
		return fmt.Errorf("network %q: %w", n.ID, err)
	}
	p.Bridge = br.Attrs().Name
	p.MTU = br.Attrs().MTU // joinBridge gave it the bridge's MTU
	return nil
}

// createMacvtap makes p a macvtap on bridged network n's interface.
func (p *Port) createMacvtap(n *api.Network, c PortConfig) error {
	mv, err := CreateMacvtap(n, c.Name, c.MAC)
	if err != nil {
		return err
	}
	p.Macvtap = true
	p.MTU, p.Index = mv.Attrs().MTU, uint32(mv.Attrs().Index)
	// A macvtap outlives its fds, and the caller may not be root when it
	// ends: the child deletes it.
	if err := p.deleteOnExit(c); err != nil {
		deleteLink(c.Name)
		return err
	}
	o := c.Offloads
	o.Relayed = false
	if p.FD, err = openMacvtap(mv, o); err != nil {
		return err
	}
	return nil
}

// CloseFD closes the port's fd. A TAP that does not persist goes with it; a
// persistent TAP stays for the VMM to open.
func (p *Port) CloseFD() {
	if p.FD >= 0 {
		unix.Close(p.FD)
		p.FD = -1
	}
}

// Close releases the port: it closes the fd and, for a port that outlives
// it, ends the cleanup child and waits until it has deleted the port.
func (p *Port) Close() {
	p.CloseFD()
	if p.reaper != nil {
		p.reaper(true)
		p.reaper = nil
	}
}

// Disown lets the port go without waiting for it: it closes the fd and
// this process's end of the pipe to the cleanup child, which deletes the
// port once the other holders of CleanupFD (the relay this process handed
// a copy to, which waits for the deletion) are gone too; the child is
// reaped when it exits, with no goroutine or thread waiting for it.
func (p *Port) Disown() {
	p.CloseFD()
	if p.reaper != nil {
		p.reaper(false)
		p.reaper = nil
	}
}

// deleteOnExit starts the child of c.Cleanup, which deletes link c.Name
// (p.Index) when the caller's end of a pipe to it closes: when the caller
// returns, exits or is killed. p.reaper closes the pipe and waits for the
// deletion, or has the child reaped when it comes. With c.Watch, c.Watch's
// process deletes it so instead, and p.reaper waits for its word.
func (p *Port) deleteOnExit(c PortConfig) error {
	if c.Watch != nil {
		keep, done, err := c.Watch(p.Index)
		if err != nil {
			return err
		}
		p.cleanupFD, p.cleanupPID, p.cleanupDone = int(keep.Fd()), 0, done
		p.reaper = func(wait bool) {
			keep.Close()
			if wait {
				io.Copy(io.Discard, done)
			}
			done.Close()
		}
		return nil
	}
	if c.Cleanup == nil {
		return fmt.Errorf("%s outlives its fd and nothing would delete it: no cleanup command", c.Name)
	}
	cmd, err := c.Cleanup(p.Index)
	if err != nil {
		return err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	dr, dw, err := os.Pipe()
	if err != nil {
		r.Close()
		w.Close()
		return err
	}
	cmd.Stdin, cmd.Stdout = r, dw
	child, err := procid.Start(cmd)
	r.Close()
	dw.Close()
	if err != nil {
		w.Close()
		dr.Close()
		return fmt.Errorf("starting the child that deletes %s: %w", c.Name, err)
	}
	p.cleanupFD, p.cleanupPID, p.cleanupDone = int(w.Fd()), child.Pid, dr
	p.reaper = func(wait bool) {
		w.Close()
		if wait {
			child.Wait()
		} else {
			child.OnExit(func(error) {})
		}
		dr.Close()
	}
	return nil
}

// DeleteLinkOnEOF is the cleanup child of a port (PortConfig.Cleanup): it
// ignores the signals its process group gets, waits for EOF on r, then
// deletes link name if it is this owner's VM port (deletePortOnEOF). The
// helper refuses to run it through sudo (helper.Main).
func DeleteLinkOnEOF(name string, r io.Reader) error {
	signal.Ignore(syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	return deletePortOnEOF(name, r)
}

// ownLink tells whether l is a VM port of this owner's (Owner): a TAP
// marked TapMark with its own name, or a macvtap with a network's mark.
func ownLink(l netlink.Link) bool {
	alias := l.Attrs().Alias
	switch l.Type() {
	case "tuntap":
		name, o, ok := tapMarkOf(alias)
		return ok && name == l.Attrs().Name && o == hostnet.Owner()
	case "macvtap":
		_, ok := hostnet.MarkedID(alias)
		return ok && hostnet.MarkOwner(alias) == hostnet.Owner()
	}
	return false
}

// deletePortOnEOF waits for EOF on r, then deletes link name if it is
// this owner's VM port (ownLink, with the Owner the cleanup child inherits
// from its helper). The port was marked before the child started
// (createTap, CreateMacvtap), so a link of the name without this owner's
// mark is not it: the port went, and another state dir's helper, or
// someone else, made a link of the same name since.
func deletePortOnEOF(name string, r io.Reader) error {
	io.Copy(io.Discard, r)
	l, err := netlink.LinkByName(name)
	switch {
	case hostnet.NotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("deleting %s: %w", name, err)
	case !ownLink(l):
		return nil
	}
	if err := netlink.LinkDel(l); err != nil && !hostnet.NotFound(err) {
		return fmt.Errorf("deleting %s: %w", name, err)
	}
	return nil
}

// deleteLink removes a link by name; a link already gone is not an error.
func deleteLink(name string) error {
	link, err := netlink.LinkByName(name)
	if hostnet.NotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	return netlink.LinkDel(link)
}

// attachTap makes TAP name of interface index, which createTap just made
// and marked, a port of bridge br (joinBridge). (A lookup before each of
// its four changes was a third of a port's making, BenchmarkCreatePort.)
func attachTap(name string, index uint32, br *netlink.Bridge, isolated bool) error {
	tap := &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: name, Index: int(index)}}
	return joinBridge(tap, br, isolated, true)
}

// joinBridge makes link l a port of bridge br, in the order the
// controller's watch takes for no drift (linkChanged: a TAP up off its
// bridge, or up and not isolated on a bridge that isolates, is drift):
// the bridge's MTU and master in one request (RTM_SETLINK by name; the
// kernel sets the MTU before the master), then its isolation, the host's
// IPv6 off, and up last, in a request of its own (the kernel applies
// flags before a master). A fresh link (a TAP just made: nobody's port,
// not isolated, down) always joins and asks for isolation only when
// isolated; another joins only where its MTU or master is not br's, and
// has its isolation set either way.
func joinBridge(l netlink.Link, br *netlink.Bridge, isolated, fresh bool) error {
	name := l.Attrs().Name
	if fresh || l.Attrs().MTU != br.Attrs().MTU || l.Attrs().MasterIndex != br.Attrs().Index {
		if err := setLink(name, false,
			nl.NewRtAttr(unix.IFLA_MTU, nl.Uint32Attr(uint32(br.Attrs().MTU))),
			nl.NewRtAttr(unix.IFLA_MASTER, nl.Uint32Attr(uint32(br.Attrs().Index)))); err != nil {
			return fmt.Errorf("adding %s to bridge %s: %w", name, br.Attrs().Name, err)
		}
	}
	if isolated || !fresh {
		if err := netlink.LinkSetIsolated(l, isolated); err != nil {
			return fmt.Errorf("setting isolation of %s: %w", name, err)
		}
	}
	if err := hostIPv6Off(name); err != nil {
		return err
	}
	if err := setLink(name, true); err != nil {
		return fmt.Errorf("setting %s up: %w", name, err)
	}
	return nil
}

// hostIPv6Off turns the host's IPv6 off on link name, a VM's port: the
// host has no address on it, IPv6 none either. Else the kernel gives it a
// link-local address and sends its duplicate address detection, MLD
// reports and router solicitations, each flooded by the bridge to every
// other VM's port, whose helper reads it: a fleet's up cost grew with the
// square of its VMs.
func hostIPv6Off(name string) error {
	if !hostnet.KernelIPv6() {
		return nil
	}
	if err := hostnet.EnsureSysctl(hostnet.IPv6Conf(name, "disable_ipv6"), "1"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("turning the host's IPv6 off on %s: %w", name, err)
	}
	return nil
}

// AttachPort makes link a port of the network bridge named bridge: same MTU
// as the bridge, isolated (no traffic to other isolated ports) when asked,
// and up. It is idempotent. CreatePort does the same for each VM's TAP,
// with the bridge it has already looked up.
func AttachPort(bridge string, link netlink.Link, isolated bool) error {
	l, err := netlink.LinkByName(bridge)
	if err != nil {
		return fmt.Errorf("network bridge %s: %w", bridge, err)
	}
	br, ok := l.(*netlink.Bridge)
	if !ok {
		return fmt.Errorf("%s is a %s, not a bridge", bridge, l.Type())
	}
	return joinBridge(link, br, isolated, false)
}

// tapMarkOf parses a TAP's mark: the TAP name it names and its owner ("" for
// none); ok is false when alias is not a TAP mark.
func tapMarkOf(alias string) (name, owner string, ok bool) {
	rest, ok := strings.CutPrefix(alias, hostnet.TapMarkPrefix)
	if !ok {
		return "", "", false
	}
	name, owner, _ = strings.Cut(rest, hostnet.OwnerSep)
	return name, owner, name != ""
}

// RemoveStaleTap deletes the TAP named name if a helper of this process's
// state dir left it behind: it must carry hostnet.TapMark(name) with this
// process's owner (Owner). A TAP whose mark has no owner (made before
// owners were marked) goes too if no process holds it; one of another
// state dir, one held under a mark without owner, or a link without the
// mark are not this state dir's and are left alone (a helper started for
// the name then fails with tapClash's error). A missing link is fine.
func RemoveStaleTap(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		if hostnet.NotFound(err) {
			return nil
		}
		return fmt.Errorf("TAP %s: %w", name, err)
	}
	if !staleTap(l) {
		return nil
	}
	if err := netlink.LinkDel(l); err != nil && !hostnet.NotFound(err) {
		return fmt.Errorf("deleting stale TAP %s: %w", name, err)
	}
	return nil
}

// staleTap tells whether RemoveStaleTap may delete link l: a TAP of this
// owner's, or of no owner, that no process holds. A TAP a live process
// holds is never stale: a helper run through sudo marks its TAP with no
// owner, as one run so by another user does, and a helper of this owner's
// that was not recorded still serves its VM.
func staleTap(l netlink.Link) bool {
	name, owner, ok := tapMarkOf(l.Attrs().Alias)
	switch {
	case !ok || name != l.Attrs().Name:
		return false
	case owner != hostnet.Owner() && owner != "":
		return false
	}
	return len(tapHolders(name)) == 0
}

// tapClash is why a TAP named name cannot be created: it removes a stale
// one (RemoveStaleTap) and returns nil if it did, else an error that says
// whose the existing link is.
func tapClash(name string) error {
	l, err := netlink.LinkByName(name)
	switch {
	case hostnet.NotFound(err):
		return nil // gone meanwhile
	case err != nil:
		return fmt.Errorf("TAP %s: %w", name, err)
	}
	if staleTap(l) {
		if err := netlink.LinkDel(l); err != nil && !hostnet.NotFound(err) {
			return fmt.Errorf("deleting stale TAP %s: %w", name, err)
		}
		return nil
	}
	holders := ""
	for _, pid := range tapHolders(name) {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		holders += fmt.Sprintf(" (pid %d holds it: %s)", pid, strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " ")))
	}
	switch _, owner, ok := tapMarkOf(l.Attrs().Alias); {
	case ok && owner != "" && owner == hostnet.Owner():
		// This state dir's, held: a helper its controller lost track of
		// (it stops those it finds: restore), or a second one for the
		// same attachment.
		return fmt.Errorf("TAP %s is held by another helper of this state dir for the same attachment%s; stop it, or run `vmnetctl up` again, which stops helpers no record accounts for", name, holders)
	case ok && owner != "":
		return fmt.Errorf("TAP %s is a VM port of another vmnetctl state dir (owner %s), where a VM of the same name, index and MAC runs; rename the VM in one of them%s", name, owner, holders)
	case ok:
		return fmt.Errorf("TAP %s is the VM port of a running helper without a state dir, or of a vmnetctl before state-dir owners%s", name, holders)
	}
	return fmt.Errorf("a %s named %s exists and is not vmnetctl's (alias %q)%s", l.Type(), name, l.Attrs().Alias, holders)
}

// tapHolders are the processes that have TAP name open (their
// /dev/net/tun descriptor's fdinfo names it).
func tapHolders(name string) []int {
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	var pids []int
	for _, fd := range fds {
		if target, err := os.Readlink(fd); err != nil || target != "/dev/net/tun" {
			continue
		}
		parts := strings.Split(fd, "/") // "", proc, PID, fd, N
		info, err := os.ReadFile(filepath.Join("/proc", parts[2], "fdinfo", parts[4]))
		if err != nil || !strings.Contains(string(info), "iff:\t"+name+"\n") {
			continue
		}
		if pid, err := strconv.Atoi(parts[2]); err == nil && !slices.Contains(pids, pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// removeOwnTaps deletes every TAP whose mark carries this process's owner
// (Sweep, once nothing of the state dir runs). A process without an owner
// deletes none.
func removeOwnTaps() error {
	if hostnet.Owner() == "" {
		return nil
	}
	links, err := hostnet.LinkList()
	if err != nil {
		return fmt.Errorf("listing links: %w", err)
	}
	var errs []error
	for _, l := range links {
		if name, owner, ok := tapMarkOf(l.Attrs().Alias); ok && name == l.Attrs().Name && owner == hostnet.Owner() {
			if err := netlink.LinkDel(l); err != nil && !hostnet.NotFound(err) {
				errs = append(errs, fmt.Errorf("deleting TAP %s: %w", name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// CreateMacvtap creates (or returns, if it is there already and marked as
// n's) the macvtap VM port name on bridged network n's interface, in bridge
// mode, with the VM's MAC address, marked as n's and up. The VM reads and
// writes frames on /dev/tap<ifindex>.
//
// Macvtap needs no change to the host interface, but the host cannot talk to
// its own macvtap VMs through that interface: the lower device does not
// loop frames back from its macvtaps. VMs on the same interface reach each
// other (bridge mode). A host that must reach its VMs bridges its interface
// and names that bridge as the network's interface instead.
func CreateMacvtap(n *api.Network, name string, mac net.HardwareAddr) (*netlink.Macvtap, error) {
	if n.Mode != api.ModeBridged {
		return nil, fmt.Errorf("network %q: only bridged networks have macvtap ports", n.ID)
	}
	parent, err := bridgedParent(n)
	if err != nil {
		return nil, err
	}
	if _, ok := parent.(*netlink.Bridge); ok {
		return nil, fmt.Errorf("network %q: interface %s is a bridge; attach a TAP to it with AttachPort", n.ID, n.Interface)
	}
	existing, err := netlink.LinkByName(name)
	switch {
	case err == nil:
		mv, ok := existing.(*netlink.Macvtap)
		owner, marked := hostnet.OwnedBy(existing)
		switch alias := existing.Attrs().Alias; {
		case !ok || !marked || owner != n.ID || mv.Attrs().ParentIndex != parent.Attrs().Index:
			return nil, fmt.Errorf("network %q: a %s named %s exists and is not this network's macvtap", n.ID, existing.Type(), name)
		case hostnet.MarkOwner(alias) != hostnet.Owner():
			// Another state dir's (or one of no owner while this
			// process has one): never taken over, nor deleted later
			// by this helper's cleanup child.
			return nil, fmt.Errorf("network %q: macvtap %s belongs to another vmnetctl state dir (alias %q): the same VM name, index and MAC run there; rename the VM in one of them",
				n.ID, name, alias)
		}
		if !bytes.Equal(mv.Attrs().HardwareAddr, mac) {
			if err := netlink.LinkSetHardwareAddr(mv, mac); err != nil {
				return nil, fmt.Errorf("network %q: setting MAC of %s: %w", n.ID, name, err)
			}
		}
		if err := netlink.LinkSetUp(mv); err != nil {
			return nil, fmt.Errorf("network %q: setting %s up: %w", n.ID, name, err)
		}
		l, err := netlink.LinkByName(name)
		if err != nil {
			return nil, err
		}
		return l.(*netlink.Macvtap), nil
	case !hostnet.NotFound(err):
		return nil, fmt.Errorf("network %q: %s: %w", n.ID, name, err)
	}
	la := netlink.NewLinkAttrs()
	la.Name = name
	la.ParentIndex = parent.Attrs().Index
	la.MTU = parent.Attrs().MTU
	la.HardwareAddr = mac
	mv := &netlink.Macvtap{Macvlan: netlink.Macvlan{LinkAttrs: la, Mode: netlink.MACVLAN_MODE_BRIDGE}}
	if err := netlink.LinkAdd(mv); err != nil {
		return nil, fmt.Errorf("network %q: creating macvtap %s on %s: %w", n.ID, name, n.Interface, err)
	}
	l, err := netlink.LinkByName(name)
	if err == nil {
		err = netlink.LinkSetAlias(l, hostnet.Mark(n.ID))
	}
	if err == nil {
		err = netlink.LinkSetUp(l)
	}
	if err != nil {
		if l != nil {
			netlink.LinkDel(l)
		}
		return nil, fmt.Errorf("network %q: setting up macvtap %s: %w", n.ID, name, err)
	}
	if l, err = netlink.LinkByName(name); err != nil {
		return nil, err
	}
	return l.(*netlink.Macvtap), nil
}
