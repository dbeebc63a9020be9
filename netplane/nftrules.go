package netplane

import (
	"fmt"
	"net/netip"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/overlay"
)

// nftRules is the content of network n's table, chain by chain: what
// ensureTable installs and what docs/dataplane.md shows. gate says
// whether the name check's TLS connections go through the kernel's path
// and the network's gate (nameGates) rather than its proxy.
func nftRules(n *api.Network, gate bool) map[string][]string {
	br := fmt.Sprintf("%q", n.Bridge())
	vxIn, vxFwd := vxlanRules(n)
	var fwd []string
	if n.Routed() {
		fwd = neighRules(br)
	}
	rules := map[string][]string{
		"input":   append(vxIn, inputRules(n, br)...),
		"forward": append(append(fwd, vxFwd...), forwardRules(n, br, gate)...),
	}
	if gate {
		rules[NameGateChain] = nameGateRules(br)
	}
	if n.Routed() {
		dnat := func(local string) []string {
			return []string{
				local + " jump " + ForwardsChain,
				local + " dnat ip to ip daddr . meta l4proto . th dport map @" + ForwardsByAddr,
				local + " dnat ip to meta l4proto . th dport map @" + ForwardsAny,
			}
		}
		// From outside, not to 127.0.0.0/8: a forward on 127.0.0.1 is the
		// host's own programs' (the output hook), and a neighbour that
		// sends to 127.0.0.1 gets nothing.
		rules["prerouting"] = append(nameCheckRedirects(n, br, gate), dnat("fib daddr type local ip daddr != 127.0.0.0/8")...)
		rules["output"] = dnat("fib daddr type local")
		// The bridge has route_localnet (for forwards used from the
		// host's loopback): no VM may send to or from 127.0.0.0/8 through
		// it, which would reach the host's loopback-only services.
		rules["early"] = []string{
			"iifname " + br + " ip daddr 127.0.0.0/8 drop",
			"iifname " + br + " ip saddr 127.0.0.0/8 drop",
		}
	}
	if nat := natRules(n, br); nat != nil {
		rules["postrouting"] = nat
	}
	return rules
}

// notReply matches what is not a reply: not only new connections, what
// conntrack calls invalid (an unsolicited reply, say) would otherwise
// pass as a VM's traffic.
const notReply = "ct state != { established, related }"

// vxlanRules are the input and forward rules of n's VXLAN segment, if it
// has one.
//
// The tunnel's socket and the hosts' name service take packets from the
// segment's hosts only: a VM (of any network here) that sent VXLAN
// packets to them would put frames on the segment past its port's guard,
// and names in its answers. Nor may a VM send them to another host, which
// would take them as this host's (masqueraded to its address). Each rule
// matches this segment's packets only (overlay.VXLANMatch: its VNI; the name
// service on this segment's tunnel addresses): segments on the same
// ports, with other hosts, have tables of their own.
func vxlanRules(n *api.Network) (input, fwd []string) {
	x := n.VXLAN
	if x == nil {
		return nil, nil
	}
	var addrs []netip.Addr
	for i := range x.Hosts {
		addrs = append(addrs, x.TunnelAddr(i)) // with WireGuard, inside it
	}
	set := overlay.NFTAddrSet(addrs)
	input = append(input, overlay.VXLANMatch(x)+" ip saddr != "+set+" drop")
	if x.WireGuard != nil {
		// Its own tunnel addresses, its own listener.
		input = append(input, "ip daddr "+set+fmt.Sprintf(" udp dport %d", x.DNSPort)+" ip saddr != "+set+" drop")
	} else {
		// Plain, the listener on an underlay address is shared by the
		// segments there, whose hosts may differ: it answers each
		// segment's hosts only (peerNames.answer); here, no VM asks.
		input = append(input, `iifname "`+api.BridgePrefix+`*" ip daddr `+set+fmt.Sprintf(" udp dport %d", x.DNSPort)+" drop")
	}
	ports := fmt.Sprintf("{ %d, %d }", min(x.Port, x.DNSPort), max(x.Port, x.DNSPort))
	fwd = append(fwd, `iifname "`+api.BridgePrefix+`*" ip daddr `+set+" udp dport "+ports+" drop")
	wgIn, wgFwd := overlay.WireGuardRules(n) // WireGuard's port; nothing plain on the underlay
	return append(input, wgIn...), append(fwd, wgFwd...)
}

// inputRules are the rules of n's input chain (after VXLAN's): what of
// the host's own services the VMs reach (bridge br).
func inputRules(n *api.Network, br string) []string {
	var input []string
	if n.DHCP {
		// The gateway's own server only (a VM whose policy denies the
		// host reaches no other DHCP service of the host's).
		input = append(input, "iifname "+br+" ip daddr { "+n.Gateway.String()+", 255.255.255.255 } udp dport 67 accept")
	}
	if n.DNSProxy {
		input = append(input, "iifname "+br+" ip daddr "+n.Gateway.String()+" meta l4proto { tcp, udp } th dport 53 accept")
		if n.HasIPv6() {
			input = append(input, "iifname "+br+" ip6 daddr "+n.Gateway6.String()+" meta l4proto { tcp, udp } th dport 53 accept")
		}
	}
	if nameChecks(n) {
		// The name check's proxy (egressproxy), for the connections
		// redirected to it alone, and only to its own sockets.
		input = append(input,
			"iifname "+br+fmt.Sprintf(" ct state new tcp dport @%s ct status dnat socket mark != 0x%08x drop", egressProxyPorts, nameCheckMark),
			"iifname "+br+" tcp dport @"+egressProxyPorts+" ct status dnat accept")
	}
	if n.Routed() {
		// After DHCP and DNS: a VM whose own policy denies the host (its
		// services, over TCP and UDP; neighbour discovery and pings stay),
		// then the network's for the other VMs.
		input = append(input,
			"iifname "+br+" "+notReply+" meta l4proto { tcp, udp } ip saddr @"+egressNoHost4+" goto "+EgressDenied,
			"iifname "+br+" "+notReply+" meta l4proto { tcp, udp } ip6 saddr @"+egressNoHost6+" goto "+EgressDenied)
	}
	if n.Egress != nil && !n.Egress.HostAllowed() {
		input = append(input,
			"iifname "+br+" "+notReply+" meta l4proto { tcp, udp } ip saddr != @"+egressOwn4+" goto "+EgressDenied,
			"iifname "+br+" "+notReply+" meta l4proto { tcp, udp } ip6 saddr != @"+egressOwn6+" goto "+EgressDenied)
	}
	return input
}

// forwardRules are the rules of n's forward chain after neighbour
// discovery's and VXLAN's: between the VMs, the name check's gate (with
// gate), port forwards, the egress policies, and what the mode lets in
// and out (bridge br).
func forwardRules(n *api.Network, br string, gate bool) []string {
	var fwd []string
	if n.Isolation {
		// Isolated ports cannot reach each other at layer 2; this keeps
		// them from doing it through the gateway at layer 3.
		fwd = append(fwd, "iifname "+br+" oifname "+br+" drop")
	} else {
		fwd = append(fwd, "iifname "+br+" oifname "+br+" accept")
	}
	if gate {
		// The connections the name check follows, both ways, before the
		// egress policy: it allowed their destination by name.
		fwd = append(fwd,
			"iifname "+br+" ct mark & "+gateMarks+" != 0x00000000 jump "+NameGateChain,
			"oifname "+br+" ct mark & "+gateMarks+" != 0x00000000 jump "+NameGateChain)
	}
	// Port forwards: connections DNAT sent into this network (to a VM:
	// the maps hold only its VMs), and their replies out of it, on host
	// networks too. Not other DNAT (a container's published port): a VM
	// of a host network must not reach it.
	fwd = append(fwd,
		"oifname "+br+" ct direction original ct status dnat accept",
		"iifname "+br+" ct direction reply ct status dnat accept")
	fwd = append(fwd, egressRules(n, br)...)
	switch n.Mode {
	case api.ModeShared:
		fwd = append(fwd, "iifname "+br+" ip saddr "+n.Subnet.String()+" accept")
		if n.RoutesIPv6() {
			fwd = append(fwd, "iifname "+br+" ip6 saddr "+n.Subnet6.String()+" accept")
		}
		fwd = append(fwd,
			"oifname "+br+" ct state established,related accept",
			"oifname "+br+" drop",
			"iifname "+br+" drop",
		)
	case api.ModeHost:
		fwd = append(fwd,
			"iifname "+br+" drop",
			"oifname "+br+" drop",
		)
	}
	return fwd
}

// egressRules are the forward chain's egress policies: the VMs' own, then
// the network's.
func egressRules(n *api.Network, br string) []string {
	var fwd []string
	if n.Routed() {
		// A VM with a policy of its own (the VM file's entry): its
		// sources and the destination ranges in one map, in place of the
		// network's.
		fwd = append(fwd,
			"iifname "+br+" "+notReply+" ip saddr . ip daddr @"+egressVMNoNames4+" goto "+EgressDenied,
			"iifname "+br+" "+notReply+" ip6 saddr . ip6 daddr @"+egressVMNoNames6+" goto "+EgressDenied,
			"iifname "+br+" "+notReply+" ip saddr @"+egressOwn4+" ip saddr . ip daddr vmap @"+egressVM4,
			"iifname "+br+" "+notReply+" ip6 saddr @"+egressOwn6+" ip6 saddr . ip6 daddr vmap @"+egressVM6)
	}
	if n.Egress != nil {
		// The egress policy decides the connections VMs open (the maps,
		// longest prefix first: egress_linux.go); what it allows goes on
		// to the rules below, which may still refuse it.
		// Names first (the DNS proxy puts their answers in the sets, for
		// as long as the answers live): a denied name's addresses are
		// refused. An allowed name's are reached through the name check
		// alone (HTTP and HTTPS, redirected in prerouting: never here);
		// anything else to them is judged by the prefixes.
		fwd = append(fwd,
			"iifname "+br+" "+notReply+" ip daddr @"+EgressNamesDenied4+" goto "+EgressDenied,
			"iifname "+br+" "+notReply+" ip6 daddr @"+EgressNamesDenied6+" goto "+EgressDenied,
			"iifname "+br+" "+notReply+" ip saddr != @"+egressOwn4+" ip daddr vmap @"+Egress4,
			"iifname "+br+" "+notReply+" ip6 saddr != @"+egressOwn6+" ip6 daddr vmap @"+Egress6)
	}
	return fwd
}

// nameChecks reports whether network n checks names: a shared network
// (whose VMs go out) with a DNS proxy (which learns the names).
func nameChecks(n *api.Network) bool { return n.Mode == api.ModeShared && n.DNSProxy }

// nameCheckMark is the mark of the name check's listening sockets
// (SO_MARK, which only a process with CAP_NET_ADMIN sets): the input
// chain lets the redirected connections reach a socket with it alone,
// not a program that took one of the ports while the controller was
// down.
const nameCheckMark = 0x766e6301

// nameCheckRedirects are the prerouting rules that send a VM's
// connections to the addresses it may reach by name to the network's
// name check: a VM's own policy's (its source and the address learned
// for it), then the network's. With gate, a connection to port 443 is
// marked pending (the gate judges its ClientHello in the kernel's path:
// gate_linux.go) and one to port 80 is redirected to the proxy
// (egressproxy, which reads every request's Host); without, both are
// redirected. A map with no port for the proxy (it is not listening yet)
// redirects nothing, and the forward chain judges the connection by the
// prefixes.
func nameCheckRedirects(n *api.Network, br string, gate bool) []string {
	if !nameChecks(n) {
		return nil
	}
	matches := [][2]string{
		{"ip saddr @" + egressOwn4 + " ip saddr . ip daddr @" + egressVMNames4, egressProxy4},
		{"ip6 saddr @" + egressOwn6 + " ip6 saddr . ip6 daddr @" + egressVMNames6, egressProxy6},
	}
	if n.Egress != nil && n.Egress.HasNames() {
		matches = append(matches,
			[2]string{"ip saddr != @" + egressOwn4 + " ip daddr @" + EgressNames4, egressProxy4},
			[2]string{"ip6 saddr != @" + egressOwn6 + " ip6 daddr @" + EgressNames6, egressProxy6})
	}
	var rules []string
	for _, m := range matches {
		ports := "{ 80, 443 }"
		if gate {
			rules = append(rules, "iifname "+br+" "+m[0]+" tcp dport 443 "+setPending)
			ports = "80"
		}
		rules = append(rules, "iifname "+br+" "+m[0]+" tcp dport "+ports+" redirect to :tcp dport map @"+m[1])
	}
	return rules
}

// The name check's gate marks the connections it follows in their
// conntrack entries' marks, bits 24 and 25 (gateMarks) and no others:
// pending from their SYN until the gate's verdict, then allowed or
// refused. The gate's reader says its verdict on a packet by sending it
// through the forward chain again with GateAllowMark or GateRefuseMark
// (the packet's own mark, which the rule that takes it puts back to
// zero).
const (
	gateMarks   = "0x03000000"
	gatePending = "0x01000000"
	gateAllowed = "0x02000000"
	gateRefused = "0x03000000"
	// setPending makes a connection's mark pending, its other bits kept.
	setPending = "ct mark set ct mark & 0xfdffffff | " + gatePending
	// GateAllowMark, GateRefuseMark and GatePassMark: the reader's
	// verdicts (GatePassMark: the server's SYN-ACK that starts a
	// connection the gate follows, whose mark is pending again).
	GateAllowMark  = 0x766e6302
	GateRefuseMark = 0x766e6303
	GatePassMark   = 0x766e6304
)

// The gate's chains: NameGateChain takes the marks and the verdicts,
// then sends a pending connection's packets to NameQueueChain, whose one
// rule queues them to the network's reader. That rule is written apart
// (writeQueueRule: the queue's number is the reader's, and on kernels
// without nftables' queue it is xtables' target, which nft cannot
// write); until it is there, or if it goes, the packets fall back to
// NameGateChain's last rule and are dropped.
const (
	NameGateChain  = "name-gate"
	NameQueueChain = "name-queue"
)

// nameGateRules are NameGateChain's rules (bridge br).
func nameGateRules(br string) []string {
	is := func(v string) string { return "ct mark & " + gateMarks + " == " + v }
	return []string{
		// The VM's SYN on a connection allowed or refused before is
		// another connection on the same ports that conntrack took for
		// the old one (a SYN it ignores, which the SYN-ACK then
		// resyncs): judged anew, not carried by the old one's mark. (Not
		// a SYN-ACK alone: one from anywhere would undo an allowed
		// connection.)
		"ct direction original tcp flags syn / syn,ack ct mark & " + gateMarks + " != " + gatePending + " " + setPending,
		// The reader's verdicts, each on a packet sent through again:
		// the SYN-ACK it follows a connection from (pending again,
		// after any verdict on an earlier one applied since), allowed
		// (from pending alone), refused (from any).
		fmt.Sprintf("meta mark 0x%08x", GatePassMark) + " " + setPending + " meta mark set 0x00000000 accept",
		is(gatePending) + fmt.Sprintf(" meta mark 0x%08x", GateAllowMark) + " ct mark set ct mark & 0xfeffffff | " + gateAllowed + " meta mark set 0x00000000 accept",
		fmt.Sprintf("meta mark 0x%08x", GateRefuseMark) + " ct mark set ct mark | " + gateRefused + " meta mark set 0x00000000",
		is(gateAllowed) + " accept",
		"meta l4proto tcp " + is(gateRefused) + " reject with tcp reset",
		// The VM's SYN is not queued (flowgate: its SYN-ACK tells the
		// gate where the stream begins), unless it carries bytes (a
		// payload byte, @ih, is there to be read): those it drops.
		"ct direction original tcp flags syn / syn,ack @ih,0,8 & 0x0 == 0x0 drop",
		"ct direction original tcp flags syn / syn,ack accept",
		// ICMP errors to the VM about its packets (a smaller MTU on the
		// way): its own stack's to take, not the gate's.
		"oifname " + br + " meta l4proto { icmp, ipv6-icmp } ct state related accept",
		is(gatePending) + " jump " + NameQueueChain,
		"drop",
	}
}

// natRules are n's postrouting chain (bridge br), nil for none.
func natRules(n *api.Network, br string) []string {
	var nat []string
	if n.Routed() {
		// A forward used from the host's loopback leaves with the
		// gateway's address (the bridge has route_localnet), and one used
		// from a VM of the network with the gateway's too, so the reply
		// comes back through the host.
		nat = append(nat,
			"oifname "+br+" ip saddr 127.0.0.0/8 masquerade",
			"oifname "+br+" ip saddr "+n.Subnet.String()+" ct status dnat masquerade")
	}
	if n.Mode == api.ModeShared {
		if n.NAT44 {
			nat = append(nat, "ip saddr "+n.Subnet.String()+" oifname != "+br+" masquerade")
		}
		if n.RoutesIPv6() {
			nat = append(nat, "ip6 saddr "+n.Subnet6.String()+" oifname != "+br+" masquerade")
		}
	}
	return nat
}

// The objects of a network's table that hold its port forwards: two maps
// from a host port to a VM's address and port (ForwardsByAddr keyed by
// the host address too, ForwardsAny for every address of the host), and
// a chain of one counting rule per forward. Their content changes with
// the VM files and the VMs' leases (SetForwards), not with the network.
const (
	// Egress4 and Egress6 map destination ranges to continue or goto
	// EgressDenied, which counts and drops.
	Egress4      = "egress4"
	Egress6      = "egress6"
	EgressDenied = "egress-denied"
	// The addresses of allowed and denied names, as the DNS proxy
	// answered them, each for its answer's TTL.
	EgressNames4       = "egress-names4"
	EgressNames6       = "egress-names6"
	EgressNamesDenied4 = "egress-nonames4"
	EgressNamesDenied6 = "egress-nonames6"

	// The VMs with a policy of their own: their sources (egressOwn),
	// those whose policy denies the host (egressNoHost), and a map from
	// source and destination range to a verdict (egressVM).
	egressOwn4    = "egress-own4"
	egressOwn6    = "egress-own6"
	egressNoHost4 = "egress-nohost4"
	egressNoHost6 = "egress-nohost6"
	egressVM4     = "egress-vm4"
	egressVM6     = "egress-vm6"
	// The addresses of the names a VM's own policy lists, as (source,
	// address) pairs, for the answers' TTL.
	// The name check's ports, by family: {80, 443} to its listener's
	// port (maps), and its listeners' ports (a set, for the input chain).
	egressProxy4     = "egress-proxy4"
	egressProxy6     = "egress-proxy6"
	egressProxyPorts = "egress-proxy-ports"
	egressVMNames4   = "egress-vmnames4"
	egressVMNames6   = "egress-vmnames6"
	egressVMNoNames4 = "egress-vmnonames4"
	egressVMNoNames6 = "egress-vmnonames6"

	ForwardsByAddr = "fwd4addr"
	ForwardsAny    = "fwd4any"
	ForwardsChain  = "forwards"
)
