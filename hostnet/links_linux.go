package hostnet

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/api"
)

// dumpRetries bounds the retries of a netlink dump that the kernel
// interrupted because the list changed while it was read.
const dumpRetries = 10

// RetryDump calls f until its dump is not interrupted.
func RetryDump[T any](f func() (T, error)) (T, error) {
	var v T
	var err error
	for range dumpRetries {
		v, err = f()
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return v, err
		}
	}
	return v, err
}

func LinkList() ([]netlink.Link, error) { return RetryDump(netlink.LinkList) }

// AddrList lists link's IPv4 addresses (AddrsOf).
func AddrList(link netlink.Link) ([]netlink.Addr, error) { return AddrsOf(link, netlink.FAMILY_V4) }

func NotFound(err error) bool {
	var lnf netlink.LinkNotFoundError
	return errors.As(err, &lnf)
}

// OwnedBy returns the network id whose mark a link carries.
func OwnedBy(l netlink.Link) (string, bool) { return MarkedID(l.Attrs().Alias) }

// AddAddr adds p to br unless it is there; an IPv6 one without duplicate
// address detection.
func AddAddr(n *api.Network, br netlink.Link, p netip.Prefix) error {
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
	if p.Addr().Is6() {
		addr.Flags = unix.IFA_F_NODAD
	}
	if err := netlink.AddrAdd(br, addr); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("network %q: adding %s to %s: %w", n.ID, p, br.Attrs().Name, err)
	}
	return nil
}

// AddrPrefix is an interface address with its prefix length (not masked),
// IPv4 unmapped.
func AddrPrefix(ipn *net.IPNet) (netip.Prefix, bool) {
	if ipn == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(ipn.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := ipn.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones), true
}

// EnsureSysctl writes value to a /proc/sys file unless it holds it already.
// /proc/sys/net belongs to the writing thread's network namespace.
func EnsureSysctl(path, value string) error {
	cur, err := os.ReadFile(path)
	if err == nil && string(bytes.TrimSpace(cur)) == value {
		return nil
	}
	return os.WriteFile(path, []byte(value), 0o644)
}

// OwnedHere returns the network id whose mark a link carries, if the mark
// is this process's (Ours).
func OwnedHere(l netlink.Link) (string, bool) {
	id, ok := OwnedBy(l)
	return id, ok && Ours(l.Attrs().Alias)
}

// IsUp reports whether link l is administratively up.
func IsUp(l netlink.Link) bool { return l.Attrs().Flags&net.FlagUp != 0 }

// MarkAndRename marks the link just made under tmpName (a name that
// carries the owner) as network id's and gives it its name: the second
// and third steps of making a link crash-safely (createBridge). On failure
// it deletes the link; a name another creator took first is an error that
// wraps unix.EEXIST.
func MarkAndRename(id, tmpName, name, what string) (netlink.Link, error) {
	l, err := netlink.LinkByName(tmpName)
	if err == nil {
		err = netlink.LinkSetAlias(l, Mark(id))
	}
	if err == nil {
		err = netlink.LinkSetName(l, name)
	}
	if err != nil {
		if l != nil {
			netlink.LinkDel(l)
		}
		return nil, fmt.Errorf("network %q: creating %s %s: %w", id, what, name, err)
	}
	return netlink.LinkByName(name)
}

// BridgeMAC is the MAC address of network id's bridge: locally
// administered, from a hash of the id. Set, it stays: a Linux bridge whose
// MAC was not set takes the lowest MAC of its ports, and changes it as VMs
// come and go, which breaks the VMs' neighbour entries for the gateway
// (the IPv6 default router, learned with its MAC from router
// advertisements, would be unreachable).
func BridgeMAC(id string) net.HardwareAddr {
	sum := sha256.Sum256([]byte("vmnetctl bridge " + id))
	mac := net.HardwareAddr(sum[:6])
	mac[0] = mac[0]&^0x01 | 0x02 // unicast, locally administered
	return mac
}

// TmpBridgePrefix starts the temporary name of a bridge being created
// (TmpBridgeName). Interface names of this form are vmnetctl's.
const TmpBridgePrefix = api.TmpBridgePrefix

// TmpBridgeName is the temporary name under which network id's bridge is
// created: "vmn.", the owner (8 hex digits) and 3 hex digits of SHA-256 of
// id (15 characters, IFNAMSIZ's limit), so that one cut short is known as
// this state dir's even before it is marked. A process without an owner
// uses "vmn." and 8 random hex digits, as before owners were marked.
func TmpBridgeName(id string) string {
	o := Owner()
	if o == "" {
		var b [4]byte
		rand.Read(b[:])
		return TmpBridgePrefix + hex.EncodeToString(b[:])
	}
	sum := sha256.Sum256([]byte("vmnetctl tmp bridge " + id))
	return TmpBridgePrefix + o + hex.EncodeToString(sum[:2])[:3]
}

// TmpVXLANName is TmpBridgeName for network id's VXLAN device (a network
// across hosts), made the same way: under it, marked, then renamed.
func TmpVXLANName(id string) string {
	name := TmpBridgeName(id)
	if Owner() == "" {
		return name
	}
	sum := sha256.Sum256([]byte("vmnetctl tmp vxlan " + id))
	return name[:len(name)-3] + hex.EncodeToString(sum[:2])[:3]
}

// TmpWireGuardName is TmpBridgeName for network id's kernel WireGuard
// device (createKernelWireGuard), made the same way.
func TmpWireGuardName(id string) string {
	name := TmpBridgeName(id)
	if Owner() == "" {
		return name
	}
	sum := sha256.Sum256([]byte("vmnetctl tmp wireguard " + id))
	return name[:len(name)-3] + hex.EncodeToString(sum[:2])[:3]
}

// TmpBridgeOwner tells a temporary bridge name from others, and returns
// the owner it carries ("" for one of a process without an owner).
func TmpBridgeOwner(name string) (owner string, ok bool) {
	rest, ok := strings.CutPrefix(name, TmpBridgePrefix)
	if !ok || strings.Trim(rest, "0123456789abcdef") != "" {
		return "", false
	}
	switch len(rest) {
	case 8:
		return "", true
	case 11:
		return rest[:8], true
	}
	return "", false
}

// RemoveStaleTmpBridges deletes the temporary bridges (and VXLAN devices,
// TmpVXLANName) this process's
// creations cut short left (id "": those of every network): those named
// with this process's owner that are unmarked (killed before the mark),
// down and without ports, or marked for the network; with id, only the one
// of id's name. A process without an owner deletes, as before owners,
// unmarked unowned ones that are down and without ports, and those marked
// for id. Another state dir's are never touched: it may be creating them.
func RemoveStaleTmpBridges(id string) {
	links, err := LinkList()
	if err != nil {
		return
	}
	ports := map[int]bool{}
	for _, l := range links {
		ports[l.Attrs().MasterIndex] = true
	}
	for _, l := range links {
		name := l.Attrs().Name
		owner, tmp := TmpBridgeOwner(name)
		_, bridge := l.(*netlink.Bridge)
		_, vxlan := l.(*netlink.Vxlan)
		_, wg := l.(*netlink.Wireguard)
		if !(bridge || vxlan || wg) || !tmp || owner != Owner() {
			continue
		}
		if owner != "" && id != "" && name != TmpBridgeName(id) && name != TmpVXLANName(id) && name != TmpWireGuardName(id) {
			continue
		}
		mid, marked := OwnedBy(l)
		unmarked := !marked && l.Attrs().Alias == "" && !IsUp(l) && !ports[l.Attrs().Index]
		if unmarked || (marked && (mid == id || id == "") && Mine(l.Attrs().Alias)) {
			netlink.LinkDel(l)
		}
	}
}

// IPv6Conf is the path of an IPv6 sysctl of interface dev ("all",
// "default" or a name) in the calling thread's network namespace.
func IPv6Conf(dev, key string) string {
	return filepath.Join("/proc/sys/net/ipv6/conf", dev, key)
}

// KernelIPv6 reports whether the host runs IPv6: not booted with
// ipv6.disable=1 (no /proc/sys/net/ipv6) nor set to leave it off on new
// interfaces (net.ipv6.conf.default.disable_ipv6=1, as administrators who
// do not want IPv6 do). vmnetctl does not turn IPv6 on for its bridges
// against that: their networks run without it (Start warns).
func KernelIPv6() bool {
	v, err := os.ReadFile(IPv6Conf("default", "disable_ipv6"))
	return err == nil && string(bytes.TrimSpace(v)) == "0"
}

// FDBOf returns the forwarding entries of the bridge port of interface
// index port: the bridge's learned and static entries on it, and the
// port's own (a VXLAN device's, NTF_SELF).
func FDBOf(port int) ([]netlink.Neigh, error) {
	return fdbDump(port, 0, func(n *netlink.Neigh) bool {
		return n.LinkIndex == port // (a kernel that dumps them all anyway)
	})
}

// FDBOfBridge returns the forwarding entries of every port of the bridge
// of interface index master, in one dump (`bridge fdb show br`): the
// kernel walks the bridge's database once a port, where FDBOf of each
// port would also walk every link of the host once a port (seconds with
// 10,000 VM ports).
func FDBOfBridge(master int) ([]netlink.Neigh, error) {
	return fdbDump(0, master, func(n *netlink.Neigh) bool { return n.MasterIndex == master })
}

// fdbDump dumps the forwarding entries of port, or of master's ports,
// asked with an ifinfomsg header as iproute2's bridge asks (a plain
// ndmsg, as netlink.NeighList sends, is read the old way, which ignores
// both), and keeps those that keep says.
func fdbDump(port, master int, keep func(*netlink.Neigh) bool) ([]netlink.Neigh, error) {
	return RetryDump(func() ([]netlink.Neigh, error) {
		req := nl.NewNetlinkRequest(unix.RTM_GETNEIGH, unix.NLM_F_DUMP)
		msg := nl.NewIfInfomsg(unix.AF_BRIDGE)
		msg.Index = int32(port)
		req.AddData(msg)
		if master != 0 {
			req.AddData(nl.NewRtAttr(unix.IFLA_MASTER, nl.Uint32Attr(uint32(master))))
		}
		msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWNEIGH)
		if err != nil {
			return nil, err
		}
		var out []netlink.Neigh
		for _, m := range msgs {
			n, err := netlink.NeighDeserialize(m)
			if err != nil {
				continue
			}
			if keep(n) {
				out = append(out, *n)
			}
		}
		return out, nil
	})
}
