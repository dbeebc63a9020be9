package overlay

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/nettypes"
)

// A network across hosts (api.VXLAN): the kernel's VXLAN device on the
// network's bridge, one per host, with a static flooding list of the other
// hosts (head-end replication: an all-zeros FDB entry per peer, so
// broadcast and unknown unicast go to each, no multicast underlay needed);
// the bridge learns where each remote MAC lives from what arrives. Every
// host's bridge has the same gateway address and MAC (BridgeMAC of the
// network's id), so a guard on the tunnel port keeps gateway, DHCP and
// router traffic on each host's side.

// VXLANHost is this host's index among n's segment hosts, the one whose
// underlay address is configured here, and the interface that has it;
// an error naming the hosts when none is.
func VXLANHost(n *api.Network) (int, string, error) {
	i, _, link, err := findVXLANHost(n)
	if err != nil {
		return -1, "", err
	}
	if l, err := netlink.LinkByIndex(link); err == nil {
		return i, l.Attrs().Name, nil
	}
	return i, "", nil
}

// LocalHost is this host's index among n's segment hosts: the one
// whose underlay address is configured here, and that address.
func LocalHost(n *api.Network) (int, netip.Addr, error) {
	i, addr, _, err := findVXLANHost(n)
	return i, addr, err
}

// findVXLANHost is LocalHost, with the index of the link that has the
// address, from one listing of the host's addresses.
func findVXLANHost(n *api.Network) (i int, addr netip.Addr, link int, err error) {
	addrs, err := hostnet.RetryDump(func() ([]netlink.Addr, error) { return netlink.AddrList(nil, netlink.FAMILY_V4) })
	if err != nil {
		return -1, netip.Addr{}, 0, fmt.Errorf("network %q: listing this host's addresses: %w", n.ID, err)
	}
	var local []netip.Addr
	links := map[netip.Addr]int{}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok {
			local = append(local, ip)
			links[ip] = a.LinkIndex
		}
	}
	i = n.VXLANHostIndex(local)
	if i < 0 {
		var names []string
		for _, h := range n.VXLAN.Hosts {
			names = append(names, fmt.Sprintf("%s (%s)", h.Name, h.Address))
		}
		return -1, netip.Addr{}, 0, fmt.Errorf("network %q spans the hosts %v, and none of their addresses is on this host: add this host to vxlan.hosts, or give it its underlay address", n.ID, names)
	}
	addr = n.VXLAN.Hosts[i].Address
	return i, addr, links[addr], nil
}

// HostNetwork is n as this host serves it: DHCP from its own slice of the
// range (api.Network.VXLANHostSlice). n itself for a network of this host
// alone.
func HostNetwork(n *api.Network) (*api.Network, error) {
	if n.VXLAN == nil {
		return n, nil
	}
	i, _, err := LocalHost(n)
	if err != nil {
		return nil, err
	}
	mine := *n
	mine.DHCPStart, mine.DHCPEnd = n.VXLANHostSlice(i)
	return &mine, nil
}

// Guard is what the overlay asks of the network's port guard (netplane's):
// Tunnel has the tunnel port, by name, checked by the tunnel's rules;
// Guarded tells whether the port of an interface index is.
type Guard struct {
	Tunnel  func(ctx context.Context, port string) error
	Guarded func(index uint32) (bool, error)
}

// EnsureVXLAN gives bridge br of n its VXLAN port, marked as n's, with the
// other hosts as its flooding list, guarded by g before it joins the
// bridge; a device of that name configured otherwise (another VNI, port or
// local address) is made again.
func EnsureVXLAN(ctx context.Context, n *api.Network, br netlink.Link, g Guard) error {
	if err := ensureWireGuard(n); err != nil { // first: the tunnel's address is on it
		return err
	}
	if n.VXLAN == nil {
		// No longer across hosts: this network's tunnel goes.
		if l := ownVXLAN(n); l != nil {
			if err := netlink.LinkDel(l); err != nil && !hostnet.NotFound(err) {
				return fmt.Errorf("network %q: deleting %s, which the network no longer has: %w", n.ID, l.Attrs().Name, err)
			}
		}
		return nil
	}
	idx, _, err := LocalHost(n)
	if err != nil {
		return err
	}
	local := n.VXLAN.TunnelAddr(idx)
	name := api.VXLANName(n.ID)
	vx, err := vxlanDevice(n, name, local)
	if err != nil {
		return err
	}
	if vx == nil {
		if vx, err = createVXLAN(n, name, local); err != nil {
			return err
		}
	}
	// Guarded before it joins the bridge: no frame of a peer's gateway
	// gets through.
	if err := g.Tunnel(ctx, name); err != nil {
		return err
	}
	if vx.Attrs().MasterIndex != br.Attrs().Index {
		if err := netlink.LinkSetMaster(vx, br); err != nil {
			return fmt.Errorf("network %q: putting %s on %s: %w", n.ID, name, br.Attrs().Name, err)
		}
	}
	// A bridge port has no address of its own: no link-local address, no
	// neighbour discovery or MLD of its own through the tunnel.
	if err := hostnet.EnsureSysctl("/proc/sys/net/ipv6/conf/"+name+"/disable_ipv6", "1"); err != nil && hostnet.KernelIPv6() {
		return fmt.Errorf("network %q: turning IPv6 off on %s: %w", n.ID, name, err)
	}
	if err := netlink.LinkSetUp(vx); err != nil {
		return fmt.Errorf("network %q: setting %s up: %w", n.ID, name, err)
	}
	if n.VXLAN.EVPN != nil {
		return ensureEVPN(ctx, n, vx, idx, local) // evpn_linux.go: FRR fills the FDB
	}
	var peers []netip.Addr
	for i := range n.VXLAN.Hosts {
		if i != idx {
			peers = append(peers, n.VXLAN.TunnelAddr(i))
		}
	}
	return ensureFlooding(n, vx, peers)
}

// createVXLAN makes n's VXLAN device name, as createBridge makes a bridge:
// under a temporary name that carries the state dir's owner, marked, then
// renamed, so that a crash at any point leaves nothing unmarked under its
// own name, and what it leaves is known as this state dir's and removed
// (hostnet.RemoveStaleTmpBridges) by the next Ensure or down --all.
func createVXLAN(n *api.Network, name string, local netip.Addr) (netlink.Link, error) {
	hostnet.RemoveStaleTmpBridges(n.ID)
	tmp := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: hostnet.TmpVXLANName(n.ID), MTU: n.VXLAN.FrameMTU()},
		VxlanId: int(n.VXLAN.VNI), SrcAddr: net.IP(local.AsSlice()), Port: int(n.VXLAN.Port), Learning: n.VXLAN.EVPN == nil}
	if err := netlink.LinkAdd(tmp); err != nil {
		return nil, fmt.Errorf("network %q: creating VXLAN device %s (as %s): %w", n.ID, name, tmp.Name, err)
	}
	return hostnet.MarkAndRename(n.ID, tmp.Name, name, "VXLAN device")
}

// vxlanDevice is the VXLAN device name of n if it is there as configured,
// nil if it is not there (or was there configured otherwise, and is now
// deleted); an error for a link of that name that is not n's.
func vxlanDevice(n *api.Network, name string, local netip.Addr) (netlink.Link, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		if hostnet.NotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("network %q: %s: %w", n.ID, name, err)
	}
	vx, isVXLAN := l.(*netlink.Vxlan)
	owner, marked := hostnet.OwnedHere(l)
	switch {
	case !marked || owner != n.ID || !isVXLAN || !hostnet.Mine(l.Attrs().Alias):
		// Unmarked (createVXLAN marks before it names), another
		// network's, or another state dir's: not ours to take.
		return nil, fmt.Errorf("network %q: a link named %s exists and is not this network's VXLAN device (alias %q): delete it, or give the network another name", n.ID, name, l.Attrs().Alias)
	case vx.VxlanId == int(n.VXLAN.VNI) && vx.Port == int(n.VXLAN.Port) && vx.SrcAddr.Equal(net.IP(local.AsSlice())) &&
		vx.Attrs().MTU == n.VXLAN.FrameMTU() && marked && vx.Learning == (n.VXLAN.EVPN == nil):
		return vx, nil
	}
	if err := netlink.LinkDel(l); err != nil && !hostnet.NotFound(err) {
		return nil, fmt.Errorf("network %q: deleting %s to make it again: %w", n.ID, name, err)
	}
	return nil, nil
}

// ensureFlooding makes the all-zeros FDB entries of vx exactly one per peer.
func ensureFlooding(n *api.Network, vx netlink.Link, peers []netip.Addr) error {
	have, err := floodList(vx)
	if err != nil {
		return fmt.Errorf("network %q: listing %s's FDB: %w", n.ID, vx.Attrs().Name, err)
	}
	var errs []error
	for _, p := range peers {
		if !slices.Contains(have, p) {
			if err := netlink.NeighAppend(floodEntry(vx, p)); err != nil {
				errs = append(errs, fmt.Errorf("network %q: flooding to %s: %w", n.ID, p, err))
			}
		}
	}
	for _, h := range have {
		if !slices.Contains(peers, h) {
			if err := netlink.NeighDel(floodEntry(vx, h)); err != nil && !hostnet.NotFound(err) {
				errs = append(errs, fmt.Errorf("network %q: removing %s from flooding: %w", n.ID, h, err))
			}
		}
	}
	return errors.Join(errs...)
}

var zeroMAC = net.HardwareAddr{0, 0, 0, 0, 0, 0}

// floodEntry is vx's FDB entry that sends broadcast and unknown unicast to
// peer (`bridge fdb append 00:00:00:00:00:00 dev VX dst PEER`).
func floodEntry(vx netlink.Link, peer netip.Addr) *netlink.Neigh {
	return &netlink.Neigh{LinkIndex: vx.Attrs().Index, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT | netlink.NUD_NOARP,
		Flags: netlink.NTF_SELF, HardwareAddr: zeroMAC, IP: net.IP(peer.AsSlice())}
}

// floodList is the peers of vx's all-zeros FDB entries.
func floodList(vx netlink.Link) ([]netip.Addr, error) {
	neighs, err := hostnet.FDBOf(vx.Attrs().Index)
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, nb := range neighs {
		if nb.HardwareAddr.String() == zeroMAC.String() && nb.IP != nil {
			if a, ok := netip.AddrFromSlice(nb.IP.To4()); ok {
				out = append(out, a)
			}
		}
	}
	return out, nil
}

// TunnelStats is what status shows of n's segment on this host: its name
// in the list, the hosts its tunnel floods to, the MACs its bridge learned
// behind the tunnel, the tunnel's byte counters and its guard's drops. nil
// when the network has no tunnel here.
func TunnelStats(n *api.Network, guardDrops map[string]uint64) *nettypes.TunnelStats {
	idx, _, err := LocalHost(n)
	if err != nil {
		return nil
	}
	l, err := netlink.LinkByName(api.VXLANName(n.ID))
	if err != nil {
		return nil
	}
	st := &nettypes.TunnelStats{Host: n.VXLAN.Hosts[idx].Name}
	peers, _ := floodList(l)
	for _, p := range peers {
		st.Peers = append(st.Peers, p.String())
	}
	neighs, _ := hostnet.FDBOf(l.Attrs().Index)
	for _, nb := range neighs {
		// The bridge's entries (MasterIndex set) learned behind the port;
		// the port's own entries (NTF_SELF) say which host each is on.
		if nb.MasterIndex != 0 && nb.State&netlink.NUD_PERMANENT == 0 {
			st.RemoteMACs++
		}
	}
	if s := l.Attrs().Statistics; s != nil {
		st.TxBytes, st.RxBytes = s.TxBytes, s.RxBytes
	}
	st.Dropped = guardDrops[api.VXLANName(n.ID)]
	if n.VXLAN.EVPN != nil {
		st.BGPPeers = len(n.VXLAN.Hosts) - 1
		sessions, err := cachedSessions(n) // evpn_linux.go: never waits on FRR
		st.BGPSessions = sessions
		if err != nil {
			st.BGPError = err.Error()
		}
	}
	wireGuardStats(n, st)
	return st
}

// ownVXLAN is network n's VXLAN device of this state dir, if there is one.
func ownVXLAN(n *api.Network) netlink.Link {
	l, err := netlink.LinkByName(api.VXLANName(n.ID))
	if err != nil {
		return nil
	}
	if id, ok := hostnet.OwnedHere(l); !ok || id != n.ID || !hostnet.Mine(l.Attrs().Alias) {
		return nil
	}
	return l
}

// CheckVXLAN is Check's part for n's tunnel: the device there as
// configured (VNI, port, local address, MTU, mark), on the network's bridge
// br (nil if it has none) and up, flooding to the other hosts and no one
// else, guarded (g.Guarded); and none for a network of this host alone.
func CheckVXLAN(ctx context.Context, n *api.Network, br netlink.Link, g Guard) []error {
	if n.VXLAN == nil {
		errs := checkWireGuard(n)
		if l := ownVXLAN(n); l != nil {
			errs = append(errs, fmt.Errorf("network %q: has the tunnel %s, and is no longer across hosts", n.ID, l.Attrs().Name))
		}
		return errs
	}
	idx, _, err := LocalHost(n)
	if err != nil {
		return []error{err}
	}
	local := n.VXLAN.TunnelAddr(idx)
	name := api.VXLANName(n.ID)
	errs := checkWireGuard(n)
	l, err := netlink.LinkByName(name)
	if err != nil {
		return []error{fmt.Errorf("network %q: VXLAN device %s: %w", n.ID, name, err)}
	}
	vx, ok := l.(*netlink.Vxlan)
	if !ok || vx.VxlanId != int(n.VXLAN.VNI) || vx.Port != int(n.VXLAN.Port) || !vx.SrcAddr.Equal(net.IP(local.AsSlice())) ||
		vx.Attrs().MTU != n.VXLAN.FrameMTU() || vx.Attrs().Alias != hostnet.Mark(n.ID) || vx.Learning != (n.VXLAN.EVPN == nil) {
		return append(errs, fmt.Errorf("network %q: %s is not the network's VXLAN device as configured", n.ID, name))
	}
	if br == nil || vx.Attrs().MasterIndex != br.Attrs().Index {
		errs = append(errs, fmt.Errorf("network %q: %s is not on the network's bridge", n.ID, name))
	}
	if vx.Attrs().Flags&net.FlagUp == 0 {
		errs = append(errs, fmt.Errorf("network %q: %s is down", n.ID, name))
	}
	if n.VXLAN.EVPN != nil {
		// evpn_linux.go: the flooding entries are FRR's.
		errs = append(errs, checkEVPN(ctx, n, vx, idx)...)
	} else {
		errs = append(errs, checkFlooding(n, vx, idx)...)
	}
	if ok, err := g.Guarded(uint32(vx.Attrs().Index)); err == nil && !ok {
		errs = append(errs, fmt.Errorf("network %q: %s is not guarded", n.ID, name))
	}
	return errs
}

// checkFlooding: vx floods to the other hosts of n's segment and no one
// else.
func checkFlooding(n *api.Network, vx netlink.Link, idx int) []error {
	var errs []error
	name := vx.Attrs().Name
	have, _ := floodList(vx)
	var peers []netip.Addr
	for i, h := range n.VXLAN.Hosts {
		if i != idx {
			peers = append(peers, n.VXLAN.TunnelAddr(i))
			if !slices.Contains(have, n.VXLAN.TunnelAddr(i)) {
				errs = append(errs, fmt.Errorf("network %q: %s does not flood to %s (%s)", n.ID, name, h.Name, n.VXLAN.TunnelAddr(i)))
			}
		}
	}
	for _, a := range have {
		if !slices.Contains(peers, a) {
			errs = append(errs, fmt.Errorf("network %q: %s floods to %s, which is not another host of the segment", n.ID, name, a))
		}
	}
	return errs
}
