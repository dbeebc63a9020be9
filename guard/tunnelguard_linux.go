package guard

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"

	"sigs.k8s.io/knftables"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/overlay"
)

// The guard of a network's tunnel port (the overlay's VXLAN device): what
// arrives from the other hosts is checked by the tunnel's rules.

// tunnelRules are the checks of what arrives from the other hosts: their
// gateways (the same address and MAC as this host's), DHCP, router
// advertisements and their neighbour discovery for the gateway stay on
// their side; the rest is their VMs' traffic, which their guards checked.
func tunnelRules(n *api.Network) []string {
	if n.VXLAN == nil {
		return nil
	}
	drop := "goto " + guardDropped
	gw := hostnet.BridgeMAC(n.ID).String()
	rs := []string{
		"ether saddr " + gw + " " + drop,
		"ether daddr " + gw + " " + drop,
		"udp dport { 67, 68, 546, 547 } " + drop,
		"arp saddr ip " + n.Gateway.String() + " " + drop,
		"arp daddr ip " + n.Gateway.String() + " " + drop,
		"icmpv6 type { nd-router-solicit, nd-router-advert, nd-redirect } " + drop,
	}
	if n.HasIPv6() {
		for _, a := range []netip.Addr{n.Gateway6, api.LinkLocal(hostnet.BridgeMAC(n.ID)).Addr()} {
			rs = append(rs,
				"ip6 saddr "+a.String()+" "+drop,
				"icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert } "+ndTarget+" "+ndTargetValue(a)+" "+drop)
		}
	}
	return append(rs, "accept")
}

// ndTargetValue is address a as nftables matches it at ndTarget (a raw
// 128-bit payload field): a number.
func ndTargetValue(a netip.Addr) string {
	b := a.As16()
	return fmt.Sprintf("0x%x", b[:])
}

// guardTunnel has port, the network's VXLAN device, checked by the
// tunnel's rules (tunnelRules, in the guard table's chain).
func guardTunnel(ctx context.Context, n *api.Network, port string) error {
	if err := ensureGuardLayout(ctx, n); err != nil {
		return err
	}
	index, err := hostnet.LinkIndex(port)
	if err != nil {
		return err
	}
	if index == 0 {
		return fmt.Errorf("network %q: guarding tunnel %s: no such link", n.ID, port)
	}
	return runGuardTx(ctx, n, "guarding tunnel "+port, func(tx *knftables.Transaction) {
		tx.Add(&knftables.Element{Set: SetTunnels, Key: []string{strconv.FormatUint(uint64(index), 10)}})
	})
}

// TunnelGuard is the overlay's view of n's guard.
func TunnelGuard(n *api.Network) overlay.Guard {
	return overlay.Guard{
		Tunnel: func(ctx context.Context, port string) error { return guardTunnel(ctx, n, port) },
		Guarded: func(index uint32) (bool, error) {
			return hostnet.HasElement(n.ID, SetTunnels, portKey(index))
		},
	}
}
