package netplane

import (
	"fmt"
	"strings"

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
	// Port forwards (forwardRules): connections the host's DNAT sent to
	// a VM, and their replies, on host networks too.
	fwd = append(fwd, "ct status dnat accept")
	var nat []string
	if n.Routed() {
		dnat := []string{
			"fib daddr type local jump " + ForwardsChain,
			"fib daddr type local dnat ip to ip daddr . meta l4proto . th dport map @" + ForwardsByAddr,
			"fib daddr type local dnat ip to meta l4proto . th dport map @" + ForwardsAny,
		}
		rules["prerouting"], rules["output"] = dnat, dnat
		// A forward used from the host's loopback leaves with the
		// gateway's address (the bridge has route_localnet), and one used
		// from a VM of the network with the gateway's too, so the reply
		// comes back through the host.
		nat = append(nat,
			"oifname "+br+" ip saddr 127.0.0.0/8 masquerade",
			"oifname "+br+" ip saddr "+n.Subnet.String()+" ct status dnat masquerade")
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
		if n.NAT44 {
			nat = append(nat, "ip saddr "+n.Subnet.String()+" oifname != "+br+" masquerade")
		}
		if n.RoutesIPv6() {
			nat = append(nat, "ip6 saddr "+n.Subnet6.String()+" oifname != "+br+" masquerade")
		}

	case api.ModeHost:
		fwd = append(fwd,
			"iifname "+br+" drop",
			"oifname "+br+" drop",
		)
	}
	rules["forward"] = fwd
	if nat != nil {
		rules["postrouting"] = nat
	}
	return rules
}

// The objects of a network's table that hold its port forwards: two maps
// from a host port to a VM's address and port (ForwardsByAddr keyed by
// the host address too, ForwardsAny for every address of the host), and
// a chain of one counting rule per forward. Their content changes with
// the VM files and the VMs' leases (SetForwards), not with the network.
const (
	ForwardsByAddr = "fwd4addr"
	ForwardsAny    = "fwd4any"
	ForwardsChain  = "forwards"
)

// ForwardKey names forward i of the attachment key ("vm/index"): the
// nftables counter of its connections, "fwd-vm-index-i", and its entry in
// ServiceStats.ForwardConns.
func ForwardKey(key string, i int) string {
	return "fwd-" + strings.ReplaceAll(key, "/", "-") + fmt.Sprintf("-%d", i)
}
