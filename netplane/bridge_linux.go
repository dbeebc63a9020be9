package netplane

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/hostnet"
)

// Why NetworkBridge refused a bridge, for errors.Is within the package.
var (
	// errNoBridge: the network's bridge does not exist (Ensure creates it).
	errNoBridge = errors.New("no bridge")
	// errNotOurs: a link of the bridge's name is not the network's bridge
	// (Ensure must leave it alone).
	errNotOurs = errors.New("not the network's bridge")
)

// bridgeError is a refusal of NetworkBridge: a message for people and a
// kind for errors.Is.
type bridgeError struct {
	kind error
	msg  string
}

func (e *bridgeError) Error() string { return e.msg }
func (e *bridgeError) Unwrap() error { return e.kind }

// IsNotUp reports whether err (from NetworkBridge) says the network's
// bridge does not exist: the network is not up.
func IsNotUp(err error) bool { return errors.Is(err, errNoBridge) }

func refuse(kind error, format string, args ...any) error {
	return &bridgeError{kind: kind, msg: fmt.Sprintf(format, args...)}
}

// NetworkBridge answers "is this our bridge, and is it up" for network n:
// it returns the bridge that n's VM ports join, checked to be one the data
// plane runs. For shared and host that is n's own bridge, which must exist,
// be a bridge, carry n's mark and be up; for bridged it is n's host
// interface, which must be a bridge that is up (the data plane creates
// nothing for a bridged network, so there is no mark to check).
//
// Ensure, Check and the helper all ask it. A bridge that is n's but down
// comes back together with the error, so that Ensure can set it up and
// Check can go on comparing it. A bridged network whose interface is not a
// bridge gives an error wrapping ErrMacvtapPort.
func NetworkBridge(n *api.Network) (*netlink.Bridge, error) {
	switch {
	case n.Mode == api.ModeBridged:
		return bridgedBridge(n)
	case !n.Routed():
		return nil, fmt.Errorf("network %q: mode %s has no ports", n.ID, n.Mode)
	}
	name := n.Bridge()
	l, err := netlink.LinkByName(name)
	switch {
	case hostnet.NotFound(err):
		return nil, refuse(errNoBridge, "network %q is not up (run `vmnetctl up`): bridge %s does not exist", n.ID, name)
	case err != nil:
		return nil, fmt.Errorf("network %q: bridge %s: %w", n.ID, name, err)
	}
	br, ok := l.(*netlink.Bridge)
	if !ok {
		return nil, refuse(errNotOurs, "network %q: %s is a %s, not vmnetctl's bridge", n.ID, name, l.Type())
	}
	switch owner, marked := hostnet.OwnedBy(br); {
	case !marked:
		return nil, refuse(errNotOurs, "network %q: bridge %s is not vmnetctl's (its alias is %q, not %q)", n.ID, name, br.Attrs().Alias, hostnet.Mark(n.ID))
	case owner != n.ID:
		return nil, refuse(errNotOurs, "network %q: bridge %s belongs to another vmnetctl network (alias %q)", n.ID, name, br.Attrs().Alias)
	case !hostnet.Ours(br.Attrs().Alias):
		return nil, refuse(errNotOurs, "network %q: bridge %s belongs to network %q of another vmnetctl state dir (alias %q); give the network another name in this one",
			n.ID, name, owner, br.Attrs().Alias)
	}
	if !hostnet.IsUp(br) {
		return br, fmt.Errorf("network %q is not up (run `vmnetctl up`): bridge %s is down", n.ID, name)
	}
	return br, nil
}

// bridgedBridge is NetworkBridge for a bridged network.
func bridgedBridge(n *api.Network) (*netlink.Bridge, error) {
	parent, err := bridgedParent(n)
	if err != nil {
		return nil, err
	}
	br, ok := parent.(*netlink.Bridge)
	if !ok {
		return nil, fmt.Errorf("network %q: interface %s is not a bridge: %w", n.ID, n.Interface, ErrMacvtapPort)
	}
	if !hostnet.IsUp(br) {
		return br, fmt.Errorf("network %q: bridge %s is down", n.ID, n.Interface)
	}
	return br, nil
}

// CheckBridgedInterface says whether bridged network n's host interface
// exists, with the interfaces this host could bridge onto when it does
// not: what validate and plan warn about (bridgedParent's check).
func CheckBridgedInterface(n *api.Network) error {
	_, err := bridgedParent(n)
	return err
}

// bridgedParent returns the host interface of bridged network n.
func bridgedParent(n *api.Network) (netlink.Link, error) {
	if n.Interface == "" {
		return nil, fmt.Errorf("network %q: bridged network has no interface", n.ID)
	}
	l, err := netlink.LinkByName(n.Interface)
	if err != nil {
		if hostnet.NotFound(err) {
			hint := ""
			if names, err := ListSharedInterfaces(); err == nil && len(names) > 0 {
				hint = "; interfaces this host could bridge onto: " + strings.Join(names, ", ")
			}
			return nil, fmt.Errorf("network %q: interface %s does not exist%s (`vmnetctl helper --list-shared-interfaces`)", n.ID, n.Interface, hint)
		}
		return nil, fmt.Errorf("network %q: interface %s: %w", n.ID, n.Interface, err)
	}
	return l, nil
}

// PortBridge returns the name of the bridge a VM's TAP joins on network n,
// checked as NetworkBridge does: the network's own bridge for shared and
// host, the host interface for a bridged network whose interface is a
// bridge. For any other bridged interface it returns "": the VM gets a
// macvtap, see CreateMacvtap.
func PortBridge(n *api.Network) (string, error) {
	br, err := NetworkBridge(n)
	switch {
	case errors.Is(err, ErrMacvtapPort):
		return "", nil
	case err != nil:
		return "", err
	}
	return br.Attrs().Name, nil
}

// ensureBridge creates n's bridge, or checks with NetworkBridge that the
// existing link of its name is n's, and sets its MTU and state.
func ensureBridge(n *api.Network) (*netlink.Bridge, error) {
	br, err := NetworkBridge(n)
	if errors.Is(err, errNoBridge) {
		if err := createBridge(n); err != nil {
			return nil, err
		}
		br, err = NetworkBridge(n)
	}
	if br == nil {
		if errors.Is(err, errNotOurs) {
			return nil, fmt.Errorf("%w; it is not this network's: delete or rename it", err)
		}
		return nil, err
	}
	// n's own bridge: a mark without an owner (an older vmnetctl's) takes
	// this state dir's, and a wrong MTU or a down state is Ensure's to
	// correct.
	if br.Attrs().Alias != hostnet.Mark(n.ID) {
		if err := netlink.LinkSetAlias(br, hostnet.Mark(n.ID)); err != nil {
			return nil, fmt.Errorf("network %q: marking bridge %s: %w", n.ID, br.Attrs().Name, err)
		}
	}
	name := br.Attrs().Name
	if mac := hostnet.BridgeMAC(n.ID); br.Attrs().HardwareAddr.String() != mac.String() {
		if err := netlink.LinkSetHardwareAddr(br, mac); err != nil {
			return nil, fmt.Errorf("network %q: setting the MAC of %s to %s: %w", n.ID, name, mac, err)
		}
	}
	if br.Attrs().MTU != n.MTU {
		if err := netlink.LinkSetMTU(br, n.MTU); err != nil {
			return nil, fmt.Errorf("network %q: setting MTU of %s to %d: %w", n.ID, name, n.MTU, err)
		}
	}
	if br.MulticastSnooping == nil || *br.MulticastSnooping {
		// Multicast goes to every port and the host: neighbour discovery
		// (sent to solicited-node groups) must reach the guard's learner,
		// whatever groups the VMs joined.
		if err := netlink.BridgeSetMcastSnoop(br, false); err != nil {
			return nil, fmt.Errorf("network %q: turning multicast snooping off on %s: %w", n.ID, name, err)
		}
	}
	if err := bridgeIPv6Sysctls(n, name); err != nil {
		return nil, err
	}
	// Port forwards used from the host's loopback leave through the
	// bridge from 127.0.0.1 (then masqueraded): allowed on this link only.
	if err := hostnet.EnsureSysctl("/proc/sys/net/ipv4/conf/"+name+"/route_localnet", "1"); err != nil {
		return nil, fmt.Errorf("network %q: setting net.ipv4.conf.%s.route_localnet=1: %w", n.ID, name, err)
	}
	if !hostnet.IsUp(br) {
		if err := netlink.LinkSetUp(br); err != nil {
			return nil, fmt.Errorf("network %q: setting %s up: %w", n.ID, name, err)
		}
	}
	return br, nil
}

// createBridge creates n's bridge with n's MTU and mark, as one step for
// whoever looks: the bridge is made under a temporary name (hostnet.TmpBridgeName),
// marked, and only then renamed to its own. The kernel ignores an alias
// given with the link's creation (IFLA_IFALIAS in RTM_NEWLINK), so the
// temporary name itself carries the owner: a crash before the mark leaves
// an unmarked temporary bridge that is still known as this state dir's,
// blocks nothing, and is deleted by the next creation of the network or by
// Sweep; a crash before the rename leaves a marked one, likewise. Another
// creator winning the race for the name is fine: NetworkBridge then judges
// its bridge.
func createBridge(n *api.Network) error {
	name := n.Bridge()
	hostnet.RemoveStaleTmpBridges(n.ID)
	la := netlink.NewLinkAttrs()
	la.Name = hostnet.TmpBridgeName(n.ID)
	la.MTU = n.MTU
	la.HardwareAddr = hostnet.BridgeMAC(n.ID)
	if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: la, MulticastSnooping: new(false)}); err != nil {
		return fmt.Errorf("network %q: creating bridge %s (as %s): %w", n.ID, name, la.Name, err)
	}
	if _, err := hostnet.MarkAndRename(n.ID, la.Name, name, "bridge"); err != nil && !errors.Is(err, unix.EEXIST) {
		return err
	}
	return nil
}

// ListSharedInterfaces returns the host interfaces a bridged network could
// use: bridges that are not vmnetctl's, and physical Ethernet devices that
// are not a bridge port (the helper joins only bridges so far: bridge those
// first).
func ListSharedInterfaces() ([]string, error) {
	links, err := hostnet.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing interfaces: %w", err)
	}
	var names []string
	for _, l := range links {
		a := l.Attrs()
		if _, ok := l.(*netlink.Bridge); ok {
			if !strings.HasPrefix(a.Alias, hostnet.AliasPrefix) && a.MasterIndex == 0 {
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
