package netplane

import (
	"fmt"

	"github.com/vmnetctl/vmnetctl/api"
)

// nftRules is the content of network n's table, chain by chain: what
// ensureTable installs and what docs/dataplane.md shows.
func nftRules(n *api.Network) map[string][]string {
	br := fmt.Sprintf("%q", n.Bridge())
	rules := map[string][]string{}
	var input []string
	if n.DHCP {
		input = append(input, "iifname "+br+" udp dport 67 accept")
	}
	if n.DNSProxy {
		input = append(input, "iifname "+br+" ip daddr "+n.Gateway.String()+" meta l4proto { tcp, udp } th dport 53 accept")
		if n.HasIPv6() {
			input = append(input, "iifname "+br+" ip6 daddr "+n.Gateway6.String()+" meta l4proto { tcp, udp } th dport 53 accept")
		}
	}
	rules["input"] = input
	var fwd []string
	if n.Isolation {
		// Isolated ports cannot reach each other at layer 2; this keeps
		// them from doing it through the gateway at layer 3.
		fwd = append(fwd, "iifname "+br+" oifname "+br+" drop")
	} else {
		fwd = append(fwd, "iifname "+br+" oifname "+br+" accept")
	}
	switch n.Mode {
	case api.ModeShared:
		fwd = append(fwd,
			"iifname "+br+" ip saddr "+n.Subnet.String()+" accept",
		)
		if n.RoutesIPv6() {
			fwd = append(fwd, "iifname "+br+" ip6 saddr "+n.Subnet6.String()+" accept")
		}
		fwd = append(fwd,
			"oifname "+br+" ct state established,related accept",
			"oifname "+br+" drop",
			"iifname "+br+" drop",
		)
		var nat []string
		if n.NAT44 {
			nat = append(nat, "ip saddr "+n.Subnet.String()+" oifname != "+br+" masquerade")
		}
		if n.RoutesIPv6() {
			nat = append(nat, "ip6 saddr "+n.Subnet6.String()+" oifname != "+br+" masquerade")
		}
		if nat != nil {
			rules["postrouting"] = nat
		}
	case api.ModeHost:
		fwd = append(fwd,
			"iifname "+br+" drop",
			"oifname "+br+" drop",
		)
	}
	rules["forward"] = fwd
	return rules
}
