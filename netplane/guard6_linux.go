package netplane

import (
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"sigs.k8s.io/knftables"
)

// The guard's IPv6 side. VMs make their own IPv6 addresses (SLAAC), so
// the network cannot hand them out as DHCP does IPv4; it learns them
// instead, first come first served (RFC 6620's idea, simplified): the
// learner (nd6_linux.go) hears a VM claim an address in neighbour
// discovery, and the address is that VM's MAC's while the VM keeps using
// it. The bindings are four sets of the guard table:
//
//	set addrs6    (MAC, IPv6) pairs: sources a VM may use
//	set owned6    the addresses bound to any VM
//	set targets6  the same pairs, typed as the target of a neighbour
//	              advertisement (@th,64,128), which nftables cannot name
//	set ownedt6   the owned addresses, typed likewise
//
// and a port's chain (port6Rules) lets a VM send from an address bound to
// its MAC; from an address nobody owns, neighbour discovery only (how the
// learner hears of a new address); never from another VM's address; and
// never advertise another VM's address.
const (
	guardAddrs6   = "addrs6"
	guardOwned6   = "owned6"
	guardTargets6 = "targets6"
	guardOwnedT6  = "ownedt6"
)

// ndTarget is the target address of a neighbour solicitation or
// advertisement: 128 bits after the ICMPv6 header's first 64.
const ndTarget = "@th,64,128"

// checksIPv6 reports whether n's guard checks IPv6 sources: networks with
// an IPv6 side, where the learner runs.
func checksIPv6(n *api.Network) bool { return guarded(n) && n.HasIPv6() }

// addGuard6Sets adds n's IPv6 binding sets to tx.
func addGuard6Sets(tx *knftables.Transaction, n *api.Network) {
	if !checksIPv6(n) {
		return
	}
	tx.Add(&knftables.Set{Name: guardAddrs6, Type: "ether_addr . ipv6_addr"})
	tx.Add(&knftables.Set{Name: guardOwned6, Type: "ipv6_addr"})
	tx.Add(&knftables.Set{Name: guardTargets6, TypeOf: "ether saddr . " + ndTarget})
	tx.Add(&knftables.Set{Name: guardOwnedT6, TypeOf: ndTarget})
}

// port6Rules are a port's IPv6 checks, after its MAC's; drop drops and
// counts.
func port6Rules(n *api.Network, drop string) []string {
	switch {
	case guarded(n) && !n.HasIPv6():
		// `ipv6: false`: no IPv6 between VMs either. Not counted as
		// spoofing: guests send router solicitations and address
		// detection on their own.
		return []string{"ether type ip6 drop"}
	case !checksIPv6(n):
		return []string{"ether type ip6 accept"}
	}
	nd := "icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit, mld-listener-report, mld2-listener-report }"
	return []string{
		// Another VM's address is not this one's to advertise.
		"icmpv6 type nd-neighbor-advert ether saddr . " + ndTarget + " != @" + guardTargets6 + " " + ndTarget + " @" + guardOwnedT6 + " " + drop,
		"ether saddr . ip6 saddr @" + guardAddrs6 + " accept",
		"ip6 saddr @" + guardOwned6 + " " + drop,
		// Duplicate address detection and MLD before a VM has an address.
		"ip6 saddr :: icmpv6 type { nd-neighbor-solicit, mld-listener-report, mld2-listener-report } accept",
		// From an address nobody owns: neighbour discovery, which the
		// learner hears, and nothing else until it has bound it.
		"ip6 saddr { fe80::/64, " + n.Subnet6.String() + " } " + nd + " accept",
		"ether type ip6 " + drop,
	}
}

// ip6Int is an IPv6 address as nft writes a 128-bit raw payload.
func ip6Int(a netip.Addr) string {
	b := a.As16()
	return "0x" + hex.EncodeToString(b[:])
}

// v6Elements are the four set elements of one binding.
func v6Elements(mac net.HardwareAddr, ip netip.Addr) []*knftables.Element {
	return []*knftables.Element{
		{Set: guardAddrs6, Key: []string{mac.String(), ip.String()}},
		{Set: guardOwned6, Key: []string{ip.String()}},
		{Set: guardTargets6, Key: []string{mac.String(), ip6Int(ip)}},
		{Set: guardOwnedT6, Key: []string{ip6Int(ip)}},
	}
}

// guard6 keeps the IPv6 sets equal to the learner's bindings.
type guard6 struct {
	n       *api.Network
	nft     knftables.Interface
	inNS    func(func() error) error
	log     *slog.Logger
	learner *nd6Learner

	mu      sync.Mutex
	failLog logLimit
}

// nd6Lifetime is how long a VM keeps an address it stopped announcing:
// the valid lifetime of the prefix in the router advertisements, the
// longest a SLAAC address lives without them. Shorter would drop
// addresses that a VM uses only towards other VMs (their neighbour
// discovery is unicast, which the learner does not see); 16 addresses per
// VM bound what stays.
const nd6Lifetime = raValidLifetime

// startGuard6 starts the learner on n's bridge and keeps the sets up to
// date with it. The sets are emptied first: what an earlier controller
// learned is learned again, as the VMs use their addresses.
func startGuard6(n *api.Network, log *slog.Logger, inNS func(func() error) error) (*guard6, error) {
	nft, err := newNFT(knftables.BridgeFamily, n.ID)
	if err != nil {
		return nil, err
	}
	g := &guard6{n: n, nft: nft, inNS: inNS, log: log}
	if err := g.run(context.Background(), func(tx *knftables.Transaction) {
		for _, s := range []string{guardAddrs6, guardOwned6, guardTargets6, guardOwnedT6} {
			tx.Flush(&knftables.Set{Name: s})
		}
		// The gateway's addresses are the network's: no VM sends from
		// them or advertises them (that would take the VMs' traffic for
		// their router), as the IPv4 guard keeps VMs from the gateway's
		// IPv4 address.
		for _, ip := range gatewayAddrs6(n) {
			tx.Add(&knftables.Element{Set: guardOwned6, Key: []string{ip.String()}})
			tx.Add(&knftables.Element{Set: guardOwnedT6, Key: []string{ip6Int(ip)}})
		}
	}); err != nil {
		return nil, err
	}
	g.learner, err = startND6Learner(n.Bridge(), n.Subnet6, nd6Lifetime, g.changed, log)
	if err != nil {
		return nil, fmt.Errorf("network %q: learning the VMs' IPv6 addresses: %w", n.ID, err)
	}
	return g, nil
}

// gatewayAddrs6 are the addresses of n's gateway on the bridge: ::1 of the
// prefix, the subnet-router anycast address (the prefix's first), and the
// bridge's link-local address.
func gatewayAddrs6(n *api.Network) []netip.Addr {
	return []netip.Addr{n.Gateway6, n.Subnet6.Masked().Addr(), linkLocal(BridgeMAC(n.ID)).Addr()}
}

// changed puts a binding the learner added or removed into the sets.
func (g *guard6) changed(b nd6Binding, added bool) {
	err := g.run(context.Background(), func(tx *knftables.Transaction) {
		for _, e := range v6Elements(b.MAC, b.IP) {
			if added {
				tx.Add(e)
			} else {
				tx.Delete(e)
			}
		}
	})
	if err != nil {
		if ok, held := g.failLog.allow(time.Now()); ok {
			g.log.Error("guard: the VMs' IPv6 addresses are not up to date", "err", err, "suppressed", held)
		}
	}
}

// run runs one transaction on the guard table, its sets made if missing.
func (g *guard6) run(ctx context.Context, build func(*knftables.Transaction)) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	tx := g.nft.NewTransaction()
	addGuardBase(tx, g.n)
	build(tx)
	if err := g.inNS(func() error { return g.nft.Run(ctx, tx) }); err != nil {
		return fmt.Errorf("network %q: updating the guard's IPv6 addresses: %w", g.n.ID, err)
	}
	return nil
}

// Close stops the learner.
func (g *guard6) Close() error { return g.learner.Close() }
