package overlay

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/vmnetctl/vmnetctl/api"
)

// WireGuardRules are the input and forward rules of an encrypted
// segment's table (api.WireGuard), after nftRules' own rules for the
// tunnel (which, with WireGuard, take the tunnel's packets from the hosts'
// tunnel addresses only): WireGuard's port takes packets from the hosts'
// underlay addresses only; the segment's VXLAN packets (its VNI) and its
// name service (on its tunnel addresses) take packets that came out of
// its WireGuard device only, so no one on the underlay can send plain
// VXLAN with a host's tunnel address as its source; no VM sends anything
// through the WireGuard device, nor to another host's WireGuard port
// (which would take it as this host's, masqueraded). Other segments'
// packets on the same ports are theirs to judge. Nothing for a segment
// without WireGuard.
func WireGuardRules(n *api.Network) (input, fwd []string) {
	x := n.VXLAN
	if x == nil || x.WireGuard == nil {
		return nil, nil
	}
	var addrs, tunnel []netip.Addr
	for i, h := range x.Hosts {
		addrs = append(addrs, h.Address)
		tunnel = append(tunnel, x.TunnelAddr(i))
	}
	wg := fmt.Sprintf("%q", api.WireGuardName(n.ID))
	input = []string{
		fmt.Sprintf("udp dport %d ip saddr != %s drop", x.WireGuard.Port, NFTAddrSet(addrs)),
		"iifname != " + wg + " " + VXLANMatch(x) + " drop",
		fmt.Sprintf("iifname != %s ip daddr %s udp dport %d drop", wg, NFTAddrSet(tunnel), x.DNSPort),
	}
	fwd = []string{
		`iifname "` + api.BridgePrefix + `*" oifname ` + wg + " drop",
		fmt.Sprintf(`iifname "%s*" ip daddr %s udp dport %d drop`, api.BridgePrefix, NFTAddrSet(addrs), x.WireGuard.Port),
	}
	return input, fwd
}

// VXLANMatch matches the segment's VXLAN packets, as nft lists it: its
// port, and its VNI (bytes 4 to 6 of the VXLAN header, after UDP's 8).
// Segments on one port are told apart by it.
func VXLANMatch(x *api.VXLAN) string {
	return fmt.Sprintf("udp dport %d @th,96,24 %#x", x.Port, x.VNI)
}

// NFTAddrSet is addrs as nft lists them (Check compares): sorted, braces
// for more than one.
func NFTAddrSet(addrs []netip.Addr) string {
	addrs = slices.Clone(addrs)
	slices.SortFunc(addrs, netip.Addr.Compare)
	var s []string
	for _, a := range addrs {
		s = append(s, a.String())
	}
	if len(s) == 1 {
		return s[0]
	}
	return "{ " + strings.Join(s, ", ") + " }"
}
