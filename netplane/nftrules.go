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
			"oifname "+br+" ct state established,related accept",
			"oifname "+br+" drop",
			"iifname "+br+" drop",
		)
		if n.NAT44 {
			rules["postrouting"] = []string{
				"ip saddr " + n.Subnet.String() + " oifname != " + br + " masquerade",
			}
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
