package netplane

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/vmnetctl/vmnetctl/api"
)

// wireGuardRules are the input and forward rules of an encrypted
// segment's table (api.WireGuard), after nftRules' own rules for the
// tunnel (which, with WireGuard, take the tunnel's packets from the hosts'
// tunnel addresses only): WireGuard's port takes packets from the hosts'
// underlay addresses only; the tunnel's port and the name service take
// packets that came out of the WireGuard device only, so no one on the
// underlay can send plain VXLAN with a host's tunnel address as its
// source; and no VM sends anything through the WireGuard device. Nothing
// for a segment without WireGuard.
func wireGuardRules(n *api.Network) (input, fwd []string) {
	x := n.VXLAN
	if x == nil || x.WireGuard == nil {
		return nil, nil
	}
	var addrs []netip.Addr
	for _, h := range x.Hosts {
		addrs = append(addrs, h.Address)
	}
	wg := fmt.Sprintf("%q", api.WireGuardName(n.ID))
	input = []string{
		fmt.Sprintf("udp dport %d ip saddr != %s drop", x.WireGuard.Port, nftAddrSet(addrs)),
		fmt.Sprintf("iifname != %s udp dport { %d, %d } drop", wg, min(x.Port, x.DNSPort), max(x.Port, x.DNSPort)),
	}
	fwd = []string{`iifname "` + api.BridgePrefix + `*" oifname ` + wg + " drop"}
	return input, fwd
}

// nftAddrSet is addrs as nft lists them (Check compares): sorted, braces
// for more than one.
func nftAddrSet(addrs []netip.Addr) string {
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
