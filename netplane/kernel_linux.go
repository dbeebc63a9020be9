package netplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/guard"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/leases"
	"github.com/vmnetctl/vmnetctl/overlay"
)

// Ensure makes the kernel state of network n what its configuration says,
// creating what is missing and correcting what differs; run twice, the
// second run changes nothing. Everything it creates carries n's mark. It
// works in the calling thread's network namespace.
//
//   - shared, host: the bridge n.Bridge() with the gateway address, the MTU,
//     up, and with isolation every TAP on it an isolated port; the nftables tables inet vmnetctl-<id> (forwarding, NAT) and
//     bridge vmnetctl-<id> (the ports' guard, guard_linux.go); for shared,
//     net.ipv4.ip_forward=1 (which Remove leaves alone: other software may
//     rely on it).
//   - bridged: nothing is created; Ensure checks that n.Interface exists.
//     VM ports are created per VM, see CreatePort.
//
// It refuses, changing nothing, a subnet that overlaps an address or a
// route on the host that is not the network's own, and a link or table of
// the network's name that is not marked as vmnetctl's.
func Ensure(ctx context.Context, n *api.Network) error {
	switch {
	case n.Mode == api.ModeBridged:
		_, err := bridgedParent(n)
		return err
	case !n.Routed():
		return fmt.Errorf("network %q: mode %s is not managed by vmnetctl", n.ID, n.Mode)
	case !n.Subnet.IsValid() || !n.Gateway.IsValid():
		return fmt.Errorf("network %q: no subnet or gateway", n.ID)
	}
	if err := checkConflicts(n); err != nil {
		return err
	}
	if err := checkTableOwner(ctx, n.ID); err != nil {
		return err
	}
	br, err := ensureBridge(n)
	if err != nil {
		return err
	}
	if err := isolateTaps(n, br); err != nil {
		return err
	}
	if err := ensureAddr(n, br); err != nil {
		return err
	}
	if err := ensureAddr6(n, br); err != nil {
		return err
	}
	if n.Mode == api.ModeShared {
		if err := hostnet.EnsureSysctl("/proc/sys/net/ipv4/ip_forward", "1"); err != nil {
			return fmt.Errorf("network %q: enabling IPv4 forwarding: %w", n.ID, err)
		}
	}
	if n.RoutesIPv6() && hostnet.KernelIPv6() {
		if err := ensureIPv6Forwarding(); err != nil {
			return fmt.Errorf("network %q: enabling IPv6 forwarding: %w", n.ID, err)
		}
	}
	if err := ensureTable(ctx, n); err != nil {
		return err
	}
	if err := guard.EnsureTable(ctx, n); err != nil {
		return err
	}
	return overlay.EnsureVXLAN(ctx, n, br, guard.TunnelGuard(n))
}

// CheckConflicts tells, changing nothing, whether network n's subnet
// overlaps an address or route of the host that is not n's own (what
// Ensure would refuse).
func CheckConflicts(n *api.Network) error { return checkConflicts(n) }

// checkConflicts refuses a subnet that overlaps an address or a route that
// belongs to something other than n's own bridge: two owners of one subnet
// would break both. A default route is not a conflict.
func checkConflicts(n *api.Network) error {
	links, err := hostnet.LinkList()
	if err != nil {
		return fmt.Errorf("listing links: %w", err)
	}
	names := map[int]string{}
	own := 0
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
		if id, ok := hostnet.OwnedBy(l); ok && id != n.ID {
			names[l.Attrs().Index] = fmt.Sprintf("%s, the bridge of network %q", l.Attrs().Name, id)
		}
		if id, ok := hostnet.OwnedHere(l); ok && id == n.ID && l.Attrs().Name == n.Bridge() {
			own = l.Attrs().Index
		}
	}
	addrs, err := hostnet.RetryDump(func() ([]netlink.Addr, error) { return netlink.AddrList(nil, netlink.FAMILY_V4) })
	if err != nil {
		return fmt.Errorf("listing addresses: %w", err)
	}
	for _, a := range addrs {
		p, ok := prefixOf(a.IPNet)
		if !ok || a.LinkIndex == own {
			continue
		}
		if p.Overlaps(n.Subnet) {
			return fmt.Errorf("network %q: subnet %s overlaps the address %s of %s; choose another subnet",
				n.ID, n.Subnet, a.IPNet, names[a.LinkIndex])
		}
	}
	routes, err := hostnet.RetryDump(func() ([]netlink.Route, error) {
		return netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		return fmt.Errorf("listing routes: %w", err)
	}
	for _, r := range routes {
		p, ok := prefixOf(r.Dst)
		if !ok || p.Bits() == 0 || (own != 0 && r.LinkIndex == own) {
			continue
		}
		if p.Overlaps(n.Subnet) {
			dev := names[r.LinkIndex]
			if dev == "" {
				dev = "no device"
			}
			return fmt.Errorf("network %q: subnet %s overlaps the route to %s (%s); choose another subnet",
				n.ID, n.Subnet, p, dev)
		}
	}
	return nil
}

func prefixOf(ipn *net.IPNet) (netip.Prefix, bool) {
	if ipn == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(ipn.IP.To4())
	if !ok {
		return netip.Prefix{}, false
	}
	ones, bits := ipn.Mask.Size()
	if bits != 32 {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(a, ones).Masked(), true
}

// ensureAddr gives n's bridge the gateway address and no other IPv4 one
// (one left from an older configuration would route a stale subnet).
func ensureAddr(n *api.Network, br netlink.Link) error {
	return ensureOnlyAddr(n, br, netip.PrefixFrom(n.Gateway, n.Subnet.Bits()), nil)
}

// ensureOnlyAddr gives br the address want and no other of its family,
// but those spare keeps (nil: none); IPv6 ones without duplicate address
// detection (the network's addresses are its own).
func ensureOnlyAddr(n *api.Network, br netlink.Link, want netip.Prefix, spare func(netip.Addr) bool) error {
	family := netlink.FAMILY_V4
	if want.Addr().Is6() {
		family = netlink.FAMILY_V6
	}
	addrs, err := hostnet.AddrsOf(br, family)
	if err != nil {
		return fmt.Errorf("network %q: listing addresses of %s: %w", n.ID, br.Attrs().Name, err)
	}
	have := false
	for _, a := range addrs {
		p, ok := hostnet.AddrPrefix(a.IPNet)
		if ok && spare != nil && spare(p.Addr()) {
			continue
		}
		if p == want {
			have = true
			continue
		}
		if err := netlink.AddrDel(br, &a); err != nil {
			return fmt.Errorf("network %q: removing stale address %s from %s: %w", n.ID, a.IPNet, br.Attrs().Name, err)
		}
	}
	if have {
		return nil
	}
	return hostnet.AddAddr(n, br, want)
}

// Remove deletes what Ensure and CreateMacvtap created for network id: its
// bridge, its nftables table and the VM ports marked as its, and with a
// non-empty stateDir its lease file. Objects that do not carry id's mark are
// left alone, so a foreign link of the bridge's name survives, and so are
// those of another state dir (another owner). A bridge or table whose mark
// has no owner (made before owners were marked) is removed, as Ensure
// adopts it: the caller removes a network it runs. A macvtap whose mark has
// no owner is not: it may be a running helper's of any state dir (from
// before owners were marked), and its helper's cleanup child deletes it.
// Removing a network that does not exist is not an error.
func Remove(ctx context.Context, id, stateDir string) error {
	var errs []error
	overlay.CloseWireGuard(id) // this process's device, before its link goes
	links, err := hostnet.LinkList()
	if err != nil {
		return fmt.Errorf("network %q: listing links: %w", id, err)
	}
	for _, l := range links {
		owner, ok := hostnet.OwnedBy(l)
		if !ok || owner != id {
			continue
		}
		if _, isBridge := l.(*netlink.Bridge); (isBridge && hostnet.Ours(l.Attrs().Alias)) || hostnet.Mine(l.Attrs().Alias) {
			if err := netlink.LinkDel(l); err != nil && !hostnet.NotFound(err) {
				errs = append(errs, fmt.Errorf("network %q: deleting %s: %w", id, l.Attrs().Name, err))
			}
		}
	}
	if err := removeTable(ctx, id); err != nil {
		errs = append(errs, err)
	}
	if err := overlay.RemoveEVPN(ctx, id); err != nil { // evpn_linux.go
		errs = append(errs, err)
	}
	if stateDir != "" {
		for _, f := range []string{LeaseFile(stateDir, id), leases.JournalPath(LeaseFile(stateDir, id))} {
			if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("network %q: removing leases: %w", id, err))
			}
		}
	}
	return errors.Join(errs...)
}

// Sweep removes, as Remove does, every network whose mark with this
// process's owner (mine) is found on a link or an nftables table, or whose
// lease file is in stateDir, but whose id is not in keep. A mark without an
// owner (from before owners were marked) does not make a network this
// state dir's to sweep: its lease file does. Swept too, with keep empty,
// are the temporary bridges of this owner's creations that were cut short
// (createBridge) and the TAPs marked with this owner (TapMark): nothing of
// the state dir runs any more. It returns the ids it removed.
func Sweep(ctx context.Context, keep []string, stateDir string) ([]string, error) {
	found := map[string]bool{}
	links, err := hostnet.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	for _, l := range links {
		if id, ok := hostnet.OwnedBy(l); ok && hostnet.Mine(l.Attrs().Alias) {
			found[id] = true
		}
	}
	tables, err := markedTables(ctx)
	if err != nil {
		return nil, err
	}
	for _, id := range tables {
		found[id] = true
	}
	if stateDir != "" {
		files, _ := filepath.Glob(filepath.Join(stateDir, "*.leases.json"))
		for _, f := range files {
			found[strings.TrimSuffix(filepath.Base(f), ".leases.json")] = true
		}
	}
	if d := hostnet.OwnerDir(); d != "" {
		frr, _ := filepath.Glob(overlay.FRRConfigFile(d, "*")) // EVPN's (evpn_linux.go)
		for _, f := range frr {
			found[strings.TrimSuffix(filepath.Base(f), ".conf")] = true
		}
	}
	var removed []string
	var errs []error
	for id := range found {
		if slices.Contains(keep, id) {
			continue
		}
		if err := Remove(ctx, id, stateDir); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, id)
	}
	if len(keep) == 0 {
		hostnet.RemoveStaleTmpBridges("")
		if err := removeOwnTaps(); err != nil {
			errs = append(errs, err)
		}
	}
	slices.Sort(removed)
	return removed, errors.Join(errs...)
}

// State is what the kernel holds for a network, read back by Inspect.
type State struct {
	ID string `json:"id"`
	// Bridge is the network's bridge; empty when it does not exist.
	Bridge string         `json:"bridge,omitempty"`
	Up     bool           `json:"up"`
	MTU    int            `json:"mtu,omitempty"`
	Addrs  []netip.Prefix `json:"addrs,omitempty"`
	// Ports are the links enslaved to the bridge (VM TAPs).
	Ports []string `json:"ports,omitempty"`
	// Macvtaps are the VM ports of a bridged network marked as its.
	Macvtaps []string `json:"macvtaps,omitempty"`
	// Table is the nftables table's listing; empty when it does not exist.
	Table string `json:"table,omitempty"`
}

// Inspect reads what the kernel holds for network id. A network with
// nothing in the kernel gives a State with every field empty.
func Inspect(ctx context.Context, id string) (*State, error) {
	s := &State{ID: id}
	links, err := hostnet.LinkList()
	if err != nil {
		return nil, fmt.Errorf("network %q: listing links: %w", id, err)
	}
	var br netlink.Link
	for _, l := range links {
		if owner, ok := hostnet.OwnedBy(l); !ok || owner != id {
			continue
		}
		if _, isBridge := l.(*netlink.Bridge); isBridge {
			br = l
		} else {
			s.Macvtaps = append(s.Macvtaps, l.Attrs().Name)
		}
	}
	if br != nil {
		s.Bridge = br.Attrs().Name
		s.Up = hostnet.IsUp(br)
		s.MTU = br.Attrs().MTU
		addrs, err := hostnet.AddrList(br)
		if err != nil {
			return nil, fmt.Errorf("network %q: listing addresses: %w", id, err)
		}
		for _, a := range addrs {
			if p, ok := prefixOf(a.IPNet); ok {
				ip, _ := netip.AddrFromSlice(a.IP.To4())
				s.Addrs = append(s.Addrs, netip.PrefixFrom(ip, p.Bits()))
			}
		}
		for _, l := range links {
			if l.Attrs().MasterIndex == br.Attrs().Index {
				s.Ports = append(s.Ports, l.Attrs().Name)
			}
		}
	}
	if s.Table, err = hostnet.TableListing(ctx, knftables.InetFamily, id); err != nil {
		return nil, err
	}
	return s, nil
}

// Check compares the kernel with what Ensure would set up for n, without
// changing anything, and returns an error naming every difference: a
// missing or foreign bridge, one that is down or has the wrong MTU or
// addresses, a VM's TAP on it that is not isolated on a network with
// isolation, a missing table or rule, forwarding off for a shared network,
// a missing bridged interface. nil means the network is up as configured.
func Check(ctx context.Context, n *api.Network) error {
	if n.Mode == api.ModeBridged {
		_, err := bridgedParent(n)
		return err
	}
	if !n.Routed() {
		return fmt.Errorf("network %q: mode %s is not managed by vmnetctl", n.ID, n.Mode)
	}
	errs := checkBridge(n)
	var bridge netlink.Link // nil without one (not a nil *Bridge)
	if br, _ := NetworkBridge(n); br != nil {
		bridge = br
		errs = append(errs, checkIPv6(n, br)...)
		errs = append(errs, checkIsolation(n, br)...)
	}
	errs = append(errs, checkTable(ctx, n)...)
	errs = append(errs, guard.CheckTable(ctx, n)...)
	errs = append(errs, overlay.CheckVXLAN(ctx, n, bridge, guard.TunnelGuard(n))...)
	if n.Mode == api.ModeShared {
		if v, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward"); err != nil || string(bytes.TrimSpace(v)) != "1" {
			errs = append(errs, fmt.Errorf("network %q: IPv4 forwarding is off", n.ID))
		}
	}
	return errors.Join(errs...)
}

// checkBridge is Check's part for n's bridge: NetworkBridge's verdict, and
// for n's own bridge, up or down, its MTU and its addresses.
func checkBridge(n *api.Network) []error {
	br, err := NetworkBridge(n)
	errs := []error{err}
	if br == nil {
		return errs
	}
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("network %q: "+format, append([]any{n.ID}, args...)...))
	}
	name := br.Attrs().Name
	if br.Attrs().MTU != n.MTU {
		bad("bridge %s has MTU %d, want %d", name, br.Attrs().MTU, n.MTU)
	}
	want := netip.PrefixFrom(n.Gateway, n.Subnet.Bits())
	addrs, err := hostnet.AddrList(br)
	if err != nil {
		bad("listing addresses of %s: %w", name, err)
	}
	var have []string
	found := false
	for _, a := range addrs {
		ip, _ := netip.AddrFromSlice(a.IP.To4())
		ones, _ := a.Mask.Size()
		p := netip.PrefixFrom(ip, ones)
		found = found || p == want
		have = append(have, p.String())
	}
	if !found || len(addrs) != 1 {
		bad("bridge %s has the addresses %v, want %s", name, have, want)
	}
	return errs
}

// checkTable is Check's part for n's nftables table: there, marked, with
// exactly the rules nftRules gives.
func checkTable(ctx context.Context, n *api.Network) []error {
	listing, err := hostnet.TableListing(ctx, knftables.InetFamily, n.ID)
	switch {
	case err != nil:
		return []error{err}
	case listing == "":
		return []error{fmt.Errorf("network %q: nftables table inet %s does not exist", n.ID, hostnet.TableName(n.ID))}
	}
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("network %q: nftables table inet %s "+format, append([]any{n.ID, hostnet.TableName(n.ID)}, args...)...))
	}
	if !strings.Contains(listing, "comment \""+hostnet.Mark(n.ID)+"\"") {
		bad("is not marked as vmnetctl's")
	}
	want := 0
	gate := nameGates(n)
	for _, rs := range nftRules(n, gate) {
		for _, r := range rs {
			want++
			if !strings.Contains(listing, "\t\t"+r+"\n") {
				bad("lacks the rule %q", r)
			}
		}
	}
	got := 0
	inChain := false // the rules of the chains nftRules gives
	for _, line := range strings.Split(listing, "\n") {
		switch {
		case strings.HasPrefix(line, "\tchain "):
			// Not the forwards' own, which change with the VMs, nor the
			// queue's (checkQueueRule).
			inChain = line != "\tchain "+ForwardsChain+" {" && line != "\tchain "+EgressDenied+" {" && line != "\tchain "+NameQueueChain+" {"
		case strings.HasPrefix(line, "\tmap "), strings.HasPrefix(line, "\tset "):
			inChain = false
		case inChain && strings.HasPrefix(line, "\t\t") && !strings.HasPrefix(line, "\t\ttype "):
			got++
		}
	}
	if got != want {
		bad("has %d rules, want %d", got, want)
	}
	if gate {
		if err := checkQueueRule(n.ID); err != nil {
			bad("%v", err)
		}
	}
	if n.Egress != nil && !strings.Contains(listing, "\tmap "+Egress4+" {\n\t\ttype ipv4_addr : verdict\n\t\tflags interval\n\t\telements = ") {
		bad("has an empty egress policy map %s", Egress4)
	}
	return errs
}
