package guard

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/guestlog"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/leases"
	"github.com/vmnetctl/vmnetctl/nettypes"
)

// The guard: anti-spoofing for the VM ports of shared and host networks,
// enforced by the kernel in the network's table of the bridge family (the
// same name as its inet table, and the same mark). It sees every frame a
// VM writes, on a socket through its helper or straight into a TAP, before
// the bridge learns or forwards it:
//
//	table bridge vmnetctl-<id>
//	  set addrs4        the (MAC, IPv4) pairs the network bound: DHCP
//	                    leases, reservations, fixed addresses (addrGuard)
//	  set guarded       the ports checked, by interface index
//	  map held          port -> its one MAC: the VM file's, or the first
//	                    the VM sends from, learned by the kernel
//	  set port-macs     (port, MAC): what held holds, as the rules look it up
//	  set drop-counts   port, with a counter: the frames the guard dropped
//	  set dhcp-rate ... per-port rate limits (meters)
//	  set partition-pairs (MAC, MAC) of VMs the network's partitions part
//	  chain prerouting  partitions; iif @guarded goto ports-v3; iif @tunnels goto tunnel
//	  chain ports-v3    the checks, one chain for every port (guardRules)
//	  chain dropped     counts the frame for its port, drops it
//	  chain impair-from, impair-to  (only while a port is impaired) the
//	                    frames its VM sends and is sent that it loses
//
// A port is guarded by elements alone, keyed by its interface index: what
// it costs does not grow with the network's ports. (Until version 3 each
// port had a chain of its own, reached through a verdict map, and each
// commit that added one made the kernel validate every port's chain again:
// 8 to 10 ms a port with a thousand on the network.) An index is never
// given to another link while the old one lives, and rarely after: the
// elements of a port that is gone cannot guard or unguard a new one, and
// are pruned at leisure (pruneGuards). A port that is not in guarded (a
// port the user attached, a port whose attachment opted out) is not
// checked.
const (
	SetAddrs  = "addrs4"
	guardHook = "prerouting"
	// The ports and what they hold.
	SetGuarded      = "guarded"         // iface_index
	SetTunnels      = "tunnels"         // iface_index: VXLAN devices (tunnelRules)
	SetPartitions   = "partition-pairs" // ether_addr . ether_addr: source and destination parted
	SetHeld         = "held"            // iface_index : ether_addr
	SetPortMACs     = "port-macs"       // iface_index . ether_addr
	guardDropCounts = "drop-counts"     // iface_index, with a counter
	// Per-port rate limits: a meter's element per port, which expires
	// when the port has been quiet for a minute.
	guardDHCPRate = "dhcp-rate"
	guardND6Rate  = "nd6-rate"
	guardDAD6Rate = "dad6-rate"
	// The ARPs copied to the IPv4 learner (package arplearn).
	SetLearn4Rate = "learn4-rate"
	// The chains: every port's checks, the tunnel's, and the drop.
	SetChecks        = "ports-v" + guardRulesVersion
	guardTunnelChain = "tunnel"
	guardDropped     = "dropped"
	// The MACs' exclusivity (ClaimPorts).
	SetClaimed  = "claimed"
	SetOwns     = "owns"
	SetExpected = "expected" // the MACs of owns, to look one up alone
	// The constant sets the rules look up.
	SetL2Types = "l2types" // ARP, IPv4, IPv6
)

// guardRulesVersion is the version of guardRules, in the name of their
// chain: a table whose hook goes to another chain (an older vmnetctl's)
// fails Check, and Ensure makes it again (ensureGuardTable), so that a
// fix to the rules reaches the VMs that run through an upgrade. 2: tagged
// frames are dropped first (issue 37). 3: one chain for every port.
const guardRulesVersion = "3"

// The sets and chains of version 2, which ensureGuardTable migrates.
const (
	v2Ports      = "ports" // map ifname : jump port-<port>
	v2Current    = "rules-v2"
	v2ChainOf    = "port-"  // a port's chain
	v2MACSetOf   = "mac-"   // a port's MAC set
	v2CounterOf  = "drops-" // a port's drop counter
	v2Template   = "tmpl-port"
	v2TemplateMA = "tmpl-mac"
	v2TemplateCo = "tmpl-drops"
)

// Guarded reports whether network n guards its ports: shared and host
// networks, whose addresses vmnetctl hands out. A bridged network's LAN is
// its owner's to police.
func Guarded(n *api.Network) bool { return n.Routed() }

// ChecksAddresses reports whether n's guard checks IPv4 sources: on every
// routed network: vmnetctl keeps its addresses (its allocator: leases,
// reservations and VM files' fixed addresses, with or without DHCP). With `dhcp: false` a VM's
// source must then be its fixed address (`ip:`) or a reservation: the
// address a VM gives itself is no one's to vouch for.
func ChecksAddresses(n *api.Network) bool { return n.Routed() }

// addGuardSets adds to tx n's guard table with its sets and chains, their
// content and rules left alone; added again, it changes nothing.
func addGuardSets(tx *knftables.Transaction, n *api.Network) {
	mark := hostnet.Mark(n.ID)
	tx.Add(&knftables.Table{Comment: &mark})
	tx.Add(&knftables.Set{Name: SetAddrs, Type: "ether_addr . ipv4_addr"})
	tx.Add(&knftables.Set{Name: SetClaimed, Type: "ether_addr", Flags: []knftables.SetFlag{knftables.DynamicFlag}})
	tx.Add(&knftables.Set{Name: SetOwns, Type: "ether_addr . ifname"})
	tx.Add(&knftables.Set{Name: SetExpected, Type: "ether_addr"})
	tx.Add(&knftables.Set{Name: SetL2Types, Type: "ether_type"})
	tx.Add(&knftables.Set{Name: SetGuarded, Type: "iface_index"})
	tx.Add(&knftables.Set{Name: SetTunnels, Type: "iface_index"})
	tx.Add(&knftables.Set{Name: SetPartitions, Type: "ether_addr . ether_addr"})
	dynamic := []knftables.SetFlag{knftables.DynamicFlag}
	tx.Add(&knftables.Map{Name: SetHeld, Type: "iface_index : ether_addr", Flags: dynamic})
	tx.Add(&knftables.Set{Name: SetPortMACs, Type: "iface_index . ether_addr", Flags: dynamic})
	// (knftables has no field for a set's stateful expressions.)
	tx.Add(&knftables.Set{Name: guardDropCounts, Type: "iface_index; flags dynamic; counter"})
	for _, meter := range []string{guardDHCPRate, guardND6Rate, guardDAD6Rate, SetLearn4Rate} {
		tx.Add(&knftables.Set{Name: meter, Type: "iface_index", Timeout: knftables.PtrTo(time.Minute),
			Flags: []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag}})
	}
	addGuard6Sets(tx, n)
	tx.Add(&knftables.Chain{Name: guardDropped})
	tx.Add(&knftables.Chain{Name: SetChecks})
	tx.Add(&knftables.Chain{Name: guardTunnelChain})
	tx.Add(&knftables.Chain{Name: guardHook, Type: knftables.PtrTo(knftables.FilterType),
		Hook: knftables.PtrTo(knftables.PreroutingHook), Priority: knftables.PtrTo(knftables.FilterPriority),
		Policy: knftables.PtrTo(knftables.AcceptPolicy)})
}

// addGuardLayout adds to tx n's guard table whole: its sets, the constant
// ones filled, and its chains with their rules, made again.
func addGuardLayout(tx *knftables.Transaction, n *api.Network) {
	addGuardSets(tx, n)
	constSet(tx, SetL2Types, "ether_type", []string{"arp", "ip", "ip6"})
	for chain, rules := range guardChains(n) {
		tx.Flush(&knftables.Chain{Name: chain})
		for _, r := range rules {
			tx.Add(&knftables.Rule{Chain: chain, Rule: r})
		}
	}
}

// guardChains is the rules of n's guard table, chain by chain.
func guardChains(n *api.Network) map[string][]string {
	return map[string][]string{
		guardDropped:     {"update @" + guardDropCounts + " { iif }", "drop"},
		SetChecks:        guardRules(n),
		guardTunnelChain: tunnelRules(n),
		guardHook: {
			// Before everything: a frame between VMs the network's
			// partitions part goes nowhere, whichever port it came in on.
			"ether saddr . ether daddr @" + SetPartitions + " drop",
			"iif @" + SetTunnels + " goto " + guardTunnelChain,
			"iif @" + SetGuarded + " goto " + SetChecks,
		},
	}
}

// EnsureTable makes n's guard table, keeping the guards of ports that
// exist, and removes the guards of ports that do not (pruneGuards). A
// table of version 2 is migrated in the same transaction: its ports are
// guarded in this version's sets, with the MACs they held, before their
// chains go.
func EnsureTable(ctx context.Context, n *api.Network) error {
	if !Guarded(n) {
		return nil
	}
	mark, exists, err := hostnet.TableMark(ctx, knftables.BridgeFamily, hostnet.TableName(n.ID))
	if err != nil {
		return err
	}
	var old *v2Guard
	var strays []portGuard
	if exists && mark == hostnet.Mark(n.ID) {
		if old, err = readV2Guard(n.ID); err != nil {
			return err
		}
		if strays, err = readStrays(n.ID); err != nil {
			return err
		}
	}
	err = runGuardTx(ctx, n, "installing nftables table bridge "+hostnet.TableName(n.ID), func(tx *knftables.Transaction) {
		// A table with another mark (an older vmnetctl's, without an
		// owner; checkTableOwner refused any other) is made again with
		// this one: its ports are guarded again by the controller
		// (EnsurePorts).
		if exists && mark != hostnet.Mark(n.ID) {
			tx.Delete(&knftables.Table{})
		}
		addGuardLayout(tx, n)
		if old != nil {
			old.migrate(tx)
		}
		for _, g := range strays {
			hostnet.DeleteElement(tx, &knftables.Element{Set: SetPortMACs, Key: []string{strconv.FormatUint(uint64(g.index), 10), g.held}})
			if !g.keepClaim {
				hostnet.DeleteElement(tx, &knftables.Element{Set: SetClaimed, Key: []string{g.held}})
			}
		}
	})
	claimsMemo.Delete(n.ID)
	impairMemo.Delete(n.ID)
	if err != nil {
		return err
	}
	return PruneGuards(n.ID)
}

// CheckTable is Check's part for n's guard table: there, marked, its
// hook going to this version's chains, which have their rules (counted,
// not compared), and no port allowed a second MAC (readStrays).
func CheckTable(ctx context.Context, n *api.Network) []error {
	if !Guarded(n) {
		return nil
	}
	mark, exists, err := hostnet.TableMark(ctx, knftables.BridgeFamily, hostnet.TableName(n.ID))
	if err != nil {
		return []error{err}
	}
	switch {
	case !exists:
		return []error{fmt.Errorf("network %q: nftables table bridge %s (the ports' guard) does not exist", n.ID, hostnet.TableName(n.ID))}
	case mark != hostnet.Mark(n.ID):
		return []error{fmt.Errorf("network %q: nftables table bridge %s is not marked as vmnetctl's", n.ID, hostnet.TableName(n.ID))}
	}
	if err := checkGuardChains(n); err != nil {
		return []error{fmt.Errorf("network %q: nftables table bridge %s: %w", n.ID, hostnet.TableName(n.ID), err)}
	}
	strays, err := readStrays(n.ID)
	if err != nil {
		return []error{err}
	}
	if len(strays) > 0 {
		return []error{fmt.Errorf("network %q: the guard lets %d ports send from a MAC beside the one they hold (port %d: %s)", n.ID, len(strays), strays[0].index, strays[0].held)}
	}
	return nil
}

// dhcpPortRate is the most DHCP requests a guarded port sends on: a
// booting client sends 2 to 4, a renewing one 1, and the server answers a
// client at most 2 a second after a burst of 10 (dhcpRate).
const dhcpPortRate = "20/second burst 40 packets"

// Meter is a rate limit of each port's own (a Meter's element per port):
// "limit rate [over] ..." in one rule would count every port's frames
// together.
func Meter(set, limit string) string { return "update @" + set + " { iif " + limit + " }" }

// guardRules are the checks of every guarded port, in order.
func guardRules(n *api.Network) []string {
	drop := "goto " + guardDropped
	// First, before the port learns a MAC or any rule looks inside: an
	// untagged frame of one of the three protocols a VM speaks. The
	// Ethernet type is read from the frame as the VM wrote it (nftables
	// puts back a tag the kernel took into the packet's metadata), so a
	// frame with any 802.1Q or 802.1ad tag, VLAN 0 included, or any stack
	// of them, is dropped here. The rules after it see the same protocol
	// whichever way they match it: by the Ethernet type, or by the
	// network and transport headers, which nftables finds past a tag.
	// Without it, a tagged frame skipped every drop that matched the
	// Ethernet type and was accepted by the rules that see through tags.
	rs := []string{"ether type != @" + SetL2Types + " " + drop}
	// A port that holds no MAC (not pinned, nothing learned yet) learns
	// its own expected MAC, or one no port of the network holds or is
	// expected to hold, which it then claims: never another VM's. Its
	// helper writes its frames one at a time, so it learns one.
	claim := " add @" + SetPortMACs + " { iif . ether saddr } add @" + SetHeld + " { iif : ether saddr } add @" + SetClaimed + " { ether saddr }"
	rs = append(rs,
		"iif != @"+SetHeld+" ether saddr . iifname @"+SetOwns+claim,
		"iif != @"+SetHeld+" ether saddr != @"+SetClaimed+claim,
		"iif . ether saddr != @"+SetPortMACs+" "+drop,
		"iif . arp saddr ether != @"+SetPortMACs+" "+drop)
	if ChecksAddresses(n) {
		if n.LearnsAddresses() {
			// A copy to the learner, which may bind the address.
			rs = append(rs, LearnRule(n))
		}
		// 0.0.0.0 is an address probe (RFC 5227), before DHCP's ACK.
		rs = append(rs, "arp saddr ip != 0.0.0.0 ether saddr . arp saddr ip != @"+SetAddrs+" "+drop)
	}
	rs = append(rs,
		"ether type arp accept",
		// A VM does not answer DHCP, from any port: clients take
		// whatever arrives on port 68, and a VM never sends to a
		// client's port.
		"ether type ip udp sport 67 "+drop,
		"ether type ip udp dport 68 "+drop,
		// A port's DHCP requests at a client's pace: a flood would
		// fill the server's socket, and the other VMs' requests would
		// be dropped before the server could tell them apart.
		"ether type ip udp dport 67 "+Meter(guardDHCPRate, "limit rate over "+dhcpPortRate)+" "+drop,
		"ether type ip ip saddr 0.0.0.0 udp sport 68 udp dport 67 accept")
	if ChecksAddresses(n) {
		rs = append(rs,
			"ether type ip ether saddr . ip saddr @"+SetAddrs+" accept",
			"ether type ip "+drop)
	} else {
		rs = append(rs, "ether type ip accept")
	}
	rs = append(rs,
		// Nor does it advertise routes or answer DHCPv6.
		"ether type ip6 icmpv6 type @"+guardRA6+" "+drop,
		"ether type ip6 udp sport 547 "+drop,
		"ether type ip6 udp dport 546 "+drop)
	rs = append(rs, port6Rules(n, drop)...)
	// Nothing else (the first rule let no other protocol through).
	return append(rs, drop)
}

// AddPort makes network n check every frame that arrives on its port
// name: one MAC (mac, or with mac nil the first the VM sends from that is
// the port's expected MAC or nobody's, until the port is guarded again),
// IPv4 sources and ARP senders the network bound to that MAC (or 0.0.0.0
// for DHCP and probes), no DHCP or DHCPv6 answers, no router
// advertisements, only IPv4, ARP and IPv6. It replaces whatever guarded
// the port before, and releases the MAC that guard learned, unless that
// guard can serve as it is (a learning port that holds nothing or its own
// expected MAC). It refuses a mac that another port of the network holds
// or is expected to hold (claimed, and neither this port's expected MAC
// nor the one it holds). CreatePort calls it for a TAP before the TAP
// joins the bridge, so no frame of it goes unchecked.
func AddPort(ctx context.Context, n *api.Network, port string, mac net.HardwareAddr) error {
	return addPort(ctx, n, port, mac, true)
}

// AddPortKept is AddPort for a caller that keeps n's guard layout itself,
// and so skips AddPort's own look at the guard's chains (four dumps, a
// tenth of what a controller's pass spends making a port): a controller
// checks each network's tables, and repairs them, on any change of them
// (its watch) and on its resync.
func AddPortKept(ctx context.Context, n *api.Network, port string, mac net.HardwareAddr) error {
	return addPort(ctx, n, port, mac, false)
}

func addPort(ctx context.Context, n *api.Network, port string, mac net.HardwareAddr, checkLayout bool) error {
	if !Guarded(n) {
		return nil
	}
	var m string
	if mac != nil {
		m = mac.String()
	} else if hostnet.Owner() == "" {
		// A standalone helper's learning port may learn its VM's MAC,
		// which the guard of a port that is gone may still hold: gone
		// guards go first. A controller's port learns its expected MAC
		// (owns) whoever held it, and the controller prunes on its
		// passes (ClaimPorts); a port with its MAC prunes only when the
		// MAC is taken, below. So a controller's helper starts at the
		// same cost however many ports the network has.
		if err := PruneGuards(n.ID); err != nil {
			return err
		}
	}
	if checkLayout {
		if err := ensureGuardLayout(ctx, n); err != nil {
			return err
		}
	}
	ps, err := readPortState(n.ID, port, m)
	if err != nil {
		return err
	}
	if ps.index == 0 {
		return fmt.Errorf("network %q: guarding port %s: no such link", n.ID, port)
	}
	if mac == nil {
		return guardLearning(n, port, ps)
	}
	if !ps.mine && ps.claimed {
		// Some port holds it: one that is gone (a helper that exited)
		// releases it once its guard is pruned, so that a helper started
		// again under another TAP name takes its VM's MAC again.
		if err := PruneGuards(n.ID); err != nil {
			return err
		}
		if ps, err = readPortState(n.ID, port, m); err != nil {
			return err
		}
		if !ps.mine && ps.claimed {
			holder := ""
			if st, err := ReadState(ctx, n.ID); err == nil {
				holder = st.holder(m, port)
			}
			return fmt.Errorf("network %q: guarding port %s: MAC %s is another VM port's%s: a port may not take it", n.ID, port, m, holder)
		}
	}
	return guardPinned(ctx, n.ID, port, ps, mac)
}

// guardPinned is GuardPort for a port pinned to mac (ps its state): in
// one batch, the MAC it held released, mac claimed, held and guarded. Its
// claim fails the batch should another port have taken mac since ps was
// read (ChangeElements' Exclusive, as `nft create element`).
func guardPinned(ctx context.Context, id, port string, ps portState, mac net.HardwareAddr) error {
	var changes []hostnet.ElementChange
	if hw, err := net.ParseMAC(ps.held); err == nil {
		keep := ps.heldExpected || ps.held == mac.String()
		changes = append(changes, releaseChanges(portGuard{index: ps.index, held: ps.held, keepClaim: keep}, hw)...)
	}
	changes = append(changes,
		hostnet.ElementChange{Set: SetClaimed, Key: mac, Exclusive: !ps.mine},
		hostnet.ElementChange{Set: SetHeld, Key: portKey(ps.index), Data: mac},
		hostnet.ElementChange{Set: SetPortMACs, Key: portMACKey(ps.index, mac)},
		hostnet.ElementChange{Set: SetGuarded, Key: portKey(ps.index)})
	err := hostnet.ChangeElements(ctx, knftables.BridgeFamily, id, changes)
	if err == nil {
		return nil
	}
	if errors.Is(err, unix.EEXIST) {
		// The claim's, or a map element whose key came to hold another
		// value since the read (a MAC the port learned meanwhile): told
		// apart by what the guard says now. Either way nothing changed.
		if now, rerr := readPortState(id, port, mac.String()); rerr == nil && now.claimed {
			return fmt.Errorf("network %q: guarding port %s: MAC %s is another VM port's (taken as it was guarded): a port may not take it", id, port, mac)
		}
		return fmt.Errorf("network %q: guarding port %s: its guard changed as it was guarded (the next pass guards it again): %w", id, port, err)
	}
	return fmt.Errorf("network %q: guarding port %s: %w", id, port, err)
}

// RemovePort removes the guard of port name, if n has one: its frames are
// no longer checked, and the MAC it held leaves claimed unless it is some
// port's expected MAC. For an attachment that opts out.
func RemovePort(ctx context.Context, n *api.Network, port string) error {
	if !Guarded(n) {
		return nil
	}
	ps, err := readPortState(n.ID, port, "")
	if err != nil || ps.index == 0 || !ps.guarded && ps.held == "" {
		return err // (no such port, or no guard: nothing to remove)
	}
	return unguardNL(n.ID, []portGuard{{index: ps.index, held: ps.held, keepClaim: ps.heldExpected}})
}

// ClaimPorts makes expected (port name -> the MAC its attachment gives the
// VM, derived or pinned) the network's owns, and claimed the expected MACs
// and those the ports hold, in one transaction: a learning port may then
// learn its own expected MAC, and no port another's, even before that
// VM sent a frame. A port that learned another port's expected MAC (before
// it was claimed) forgets it: its frames from it are dropped. The
// controller calls it on every pass, before it starts helpers; it changes
// nothing when the sets are already so. Unless o.Reread, it changes the
// sets from what it last wrote to them in this process (claimsMemo); with
// o.Reread or o.PortsGone it removes the guards of ports that are gone
// (goneGuards reads every port's: a pass that only attaches VMs costs
// the same however many there are).
func ClaimPorts(ctx context.Context, n *api.Network, expected map[string]net.HardwareAddr, o nettypes.ClaimOptions) error {
	if !Guarded(n) {
		return nil
	}
	reread := o.Reread
	var gone []portGuard
	if o.Reread || o.PortsGone || len(o.GonePorts) > 0 {
		var only []uint32
		if !o.Reread && !o.PortsGone {
			only = o.GonePorts
		}
		var err error
		if gone, err = goneGuards(n.ID, only); err != nil {
			return err
		}
	}
	owns, owner := map[PortMAC]bool{}, map[string]string{}
	for port, mac := range expected {
		owns[PortMAC{mac.String(), port}] = true
		owner[mac.String()] = port
	}
	ExpectedMACs := map[string]bool{}
	for mac := range owner {
		ExpectedMACs[mac] = true
	}
	// Without the ports' MACs first: what they learned matters only when
	// a MAC stops being expected (it stays claimed if a port holds it) or
	// a newly expected one is claimed already (a port that learned it
	// loses it). Attaching VMs needs neither, and so costs the same
	// however many ports there are.
	st, err := claimsState(n.ID, reread, ExpectedMACs)
	if err != nil {
		return err
	}
	if !st.exists {
		// A table without its sets (none yet, or an older vmnetctl's):
		// made first.
		if err := EnsureTable(ctx, n); err != nil {
			return err
		}
		if st, err = readGuardStateNL(n.ID, false); err != nil {
			return err
		}
	}
	full, stillHeld, err := stillHeldBy(n.ID, st, ExpectedMACs)
	if err != nil {
		return err
	}
	// A MAC now expected on another port (its attachment's TAP name
	// changed): the port that holds it may be the old one, which every
	// port's state can tell, and which then loses it.
	for p := range st.Owns {
		if o, ok := owner[p.MAC]; ok && o != p.Port {
			full = true
		}
	}
	// What changes, written through netlink: a VM more or less costs its
	// own elements, not nft's read of the whole table.
	var ch claimsChange
	if !full {
		// The expected MACs nobody holds yet are claimed; those no
		// longer expected and no longer held leave.
		ch.delExpected, ch.addExpected = setDiff(st.ExpectedMACs, ExpectedMACs)
		_, ch.addClaimed = setDiff(st.Claimed, ExpectedMACs)
		for _, mac := range ch.delExpected {
			if st.Claimed[mac] && !stillHeld[mac] {
				ch.delClaimed = append(ch.delClaimed, mac)
			}
		}
	} else {
		if st, err = readGuardStateNL(n.ID, true); err != nil {
			return err
		}
		ch = fullClaims(st, owner, ExpectedMACs)
	}
	ch.delOwns, ch.addOwns = setDiff(st.Owns, owns)
	// The guards of the ports that went are removed in the batch that
	// changes the claims (a few at a time; a `down`'s many in batches of
	// their own): a commit that deletes waits for the kernel's readers,
	// once rather than twice for a VM that leaves.
	if len(gone) > PruneChunk {
		if err := pruneGone(n.ID, gone, ExpectedMACs); err != nil {
			return err
		}
		gone = nil
	}
	if ch.empty() && len(gone) == 0 {
		rememberClaims(n.ID, owns, ExpectedMACs)
		return nil
	}
	if err := applyClaims(n.ID, ch, gone, ExpectedMACs); err != nil {
		claimsMemo.Delete(n.ID)
		return err
	}
	rememberClaims(n.ID, owns, ExpectedMACs)
	return nil
}

// ClaimPortsChanged is ClaimPorts for a network whose ports' expected
// MACs differ from those of its last claims in this process, which
// succeeded, only in expect (ports now expected, with their MACs: new, or
// changed) and drop (ports no longer expected): it changes the claims of
// those ports alone, from what it remembers of the last claims (as
// ClaimPorts without o.Reread would, with the expected MACs of every port
// given), so that a VM's attach or detach costs the same however many VMs
// the network has. handled is false, and nothing is changed, when only
// ClaimPorts can tell: nothing remembered (another process's claims, a
// table made again, a failed write), o.Reread or o.PortsGone, a MAC that
// moves from one port to another, or a newly expected MAC claimed
// already (some port learned it). A network's claims must not be made
// by two calls at once.
func ClaimPortsChanged(ctx context.Context, n *api.Network, expect map[string]net.HardwareAddr, drop []string, o nettypes.ClaimOptions) (handled bool, err error) {
	if !Guarded(n) {
		return true, nil
	}
	m, ok := claimsMemo.Load(n.ID)
	if !ok || o.Reread || o.PortsGone {
		return false, nil
	}
	memo := m.(*claimsMemoized)
	var ch claimsChange
	delExp, addExp := map[string]bool{}, map[string]bool{}
	unown := func(port string) {
		if mac, ok := memo.ports[port]; ok {
			ch.delOwns = append(ch.delOwns, PortMAC{mac, port})
			delExp[mac] = true
		}
	}
	newMACs := map[string]string{} // port -> its MAC now
	for port, hw := range expect {
		mac := hw.String()
		if memo.ports[port] == mac {
			continue
		}
		if q, ok := memo.owner[mac]; ok && q != port {
			return false, nil // a MAC that moves between ports: every port's state tells
		}
		for q, other := range newMACs {
			if other == mac && q != port {
				return false, nil
			}
		}
		unown(port)
		newMACs[port] = mac
		ch.addOwns = append(ch.addOwns, PortMAC{mac, port})
		addExp[mac] = true
	}
	for _, port := range drop {
		if _, still := expect[port]; !still {
			unown(port)
		}
	}
	for mac := range addExp {
		delete(delExp, mac) // (a port's own MAC again: expected still)
		hw, err := net.ParseMAC(mac)
		if err != nil {
			return false, nil
		}
		claimed, err := hostnet.HasElement(n.ID, SetClaimed, hw)
		if err != nil {
			return false, nil // (the table gone: ClaimPorts makes it)
		}
		if claimed && !memo.expected[mac] {
			return false, nil // a port learned it: every port's state tells
		}
		if !memo.expected[mac] {
			ch.addExpected = append(ch.addExpected, mac)
			ch.addClaimed = append(ch.addClaimed, mac)
		}
	}
	// A MAC no longer expected stays claimed while the port that owned
	// it still holds it (no other could learn a claimed MAC).
	for mac := range delExp {
		ch.delExpected = append(ch.delExpected, mac)
		held, err := ReadHeld(n.ID, memo.owner[mac]) // "" for a port that is gone
		if err != nil {
			return false, nil
		}
		if held != mac {
			ch.delClaimed = append(ch.delClaimed, mac)
		}
	}
	var gone []portGuard
	if len(o.GonePorts) > 0 {
		if gone, err = goneGuards(n.ID, o.GonePorts); err != nil {
			return false, nil
		}
	}
	// The memo is the claims now, and the expected set gone guards are
	// told of; forgotten if the write fails.
	for _, p := range ch.delOwns {
		delete(memo.owns, p)
		delete(memo.ports, p.Port)
		if memo.owner[p.MAC] == p.Port {
			delete(memo.owner, p.MAC)
		}
	}
	for mac := range delExp {
		delete(memo.expected, mac)
	}
	for _, p := range ch.addOwns {
		memo.owns[p] = true
		memo.ports[p.Port] = p.MAC
		memo.owner[p.MAC] = p.Port
		memo.expected[p.MAC] = true
	}
	if len(gone) > PruneChunk {
		if err := pruneGone(n.ID, gone, memo.expected); err != nil {
			claimsMemo.Delete(n.ID)
			return true, err
		}
		gone = nil
	}
	if ch.empty() && len(gone) == 0 {
		return true, nil
	}
	if err := applyClaims(n.ID, ch, gone, memo.expected); err != nil {
		claimsMemo.Delete(n.ID)
		return true, err
	}
	return true, nil
}

// fullClaims is the change that makes the claims what owner (expected MAC
// to port) and the ports' state st want, from every port's state: claimed
// are what the ports hold and the expected MACs, and a port that holds
// another port's expected MAC loses it.
func fullClaims(st *State, owner map[string]string, ExpectedMACs map[string]bool) claimsChange {
	var ch claimsChange
	claimed := map[string]bool{}
	for port, mac := range st.Learned {
		if o, ok := owner[mac]; ok && o != port {
			ch.evict = append(ch.evict, portGuard{index: st.index[port], held: mac, keepClaim: true})
			continue
		}
		claimed[mac] = true
	}
	for mac := range owner {
		claimed[mac] = true
	}
	ch.delExpected, ch.addExpected = setDiff(st.ExpectedMACs, ExpectedMACs)
	ch.delClaimed, ch.addClaimed = setDiff(st.Claimed, claimed)
	return ch
}

// claimsMemo is, by network ID, what ClaimPorts last wrote to the owns and
// expected sets in this process (the controller's), which nobody else
// writes: a pass that attaches a VM changes them from it, where reading
// them would cost as much as the network's VMs (two sets of a thousand
// elements, and claimed). It is forgotten when the guard table is made
// again, and not used on the passes that reread.
var claimsMemo sync.Map // string -> *claimsMemoized

// claimsMemoized is what the last claims wrote. ClaimPorts stores maps it
// made for the call and drops, and claimsState gives them to the State it
// makes as they are (Owns, ExpectedMACs, which ClaimPorts only reads): a
// pass copies no map of the network's size. ClaimPortsChanged changes
// them in place, the network's calls being one at a time.
type claimsMemoized struct {
	owns     map[PortMAC]bool
	expected map[string]bool
	// ports is each expected port's MAC, owner each expected MAC's port:
	// what ClaimPortsChanged looks a changed port's up in.
	ports, owner map[string]string
}

// rememberClaims stores owns and expected, which the caller no longer
// writes, in claimsMemo, and their indexes by port and by MAC.
func rememberClaims(id string, owns map[PortMAC]bool, expected map[string]bool) {
	m := &claimsMemoized{owns: owns, expected: expected, ports: make(map[string]string, len(owns)), owner: make(map[string]string, len(owns))}
	for p := range owns {
		m.ports[p.Port] = p.MAC
		m.owner[p.MAC] = p.Port
	}
	claimsMemo.Store(id, m)
}

// claimsState is the guard state ClaimPorts starts from, without the
// ports' MACs: read from the kernel, or (unless reread) from claimsMemo.
// From the memo, claimed is the MACs expected then (which stay claimed
// until ClaimPorts releases them), and the MACs newly expected are looked
// up in claimed one by one: one a port learned before it was expected
// makes ClaimPorts read everything (stillHeldBy).
func claimsState(id string, reread bool, expected map[string]bool) (*State, error) {
	m, ok := claimsMemo.Load(id)
	if reread || !ok {
		return readGuardStateNL(id, false)
	}
	memo := m.(*claimsMemoized)
	// Owns and ExpectedMACs are the memo's own (read only); Claimed takes
	// the lookups of the newly expected MACs.
	st := &State{exists: true, Learned: map[string]string{}, index: map[string]uint32{},
		Owns: memo.owns, ExpectedMACs: memo.expected, Claimed: maps.Clone(memo.expected)}
	for mac := range expected {
		if st.ExpectedMACs[mac] {
			continue
		}
		hw, err := net.ParseMAC(mac)
		if err != nil {
			continue
		}
		claimed, err := hostnet.HasElement(id, SetClaimed, hw)
		if err != nil {
			return nil, err
		}
		st.Claimed[mac] = claimed
	}
	return st, nil
}

// stillHeldBy tells, of the MACs st expects that expected no longer
// holds, those a port still holds: they stay claimed. A MAC no longer
// expected can be held only by the port that owned it (no other could
// learn a claimed MAC): that port's alone is read. full is true when only
// every port's can tell: a newly expected MAC is claimed already (some
// port learned it), or a MAC no longer expected has no owner recorded.
func stillHeldBy(id string, st *State, expected map[string]bool) (full bool, stillHeld map[string]bool, err error) {
	for mac := range expected {
		if !st.ExpectedMACs[mac] && st.Claimed[mac] {
			return true, nil, nil
		}
	}
	ownerOf := map[string][]string{}
	for p := range st.Owns {
		ownerOf[p.MAC] = append(ownerOf[p.MAC], p.Port)
	}
	stillHeld = map[string]bool{}
	for mac := range st.ExpectedMACs {
		if expected[mac] {
			continue
		}
		if len(ownerOf[mac]) == 0 {
			return true, nil, nil
		}
		for _, port := range ownerOf[mac] {
			held, err := ReadHeld(id, port) // "" for a port that is gone
			if err != nil {
				return false, nil, err
			}
			stillHeld[mac] = stillHeld[mac] || held == mac
		}
	}
	return false, stillHeld, nil
}

// setDiff is what to delete from have and add to it to make want.
func setDiff[K comparable](have, want map[K]bool) (del, add []K) {
	for k := range have {
		if !want[k] {
			del = append(del, k)
		}
	}
	for k := range want {
		if !have[k] {
			add = append(add, k)
		}
	}
	return del, add
}

// PortMAC is a MAC (as text) and a port's name.
type PortMAC struct{ MAC, Port string }

// State is what a network's guard table holds of its MACs.
type State struct {
	exists       bool              // the table and its sets
	Learned      map[string]string // port -> the MAC it holds (learned or pinned); ports that exist
	index        map[string]uint32 // port -> its interface index, for learned
	Claimed      map[string]bool
	Owns         map[PortMAC]bool
	ExpectedMACs map[string]bool
}

// holder names, for an error, the port other than port that holds or is
// expected to hold mac.
func (st *State) holder(mac, port string) string {
	for p, m := range st.Learned {
		if m == mac && p != port {
			return " (port " + p + ")"
		}
	}
	for p := range st.Owns {
		if p.MAC == mac && p.Port != port {
			return " (port " + p.Port + ")"
		}
	}
	return ""
}

// ReadState reads the MACs of network id's guard table, all of them
// (readGuardStateNL); all empty without the table. For errors, and for
// ExpectedPort: GuardPort reads only its own port's (readPortState).
func ReadState(_ context.Context, id string) (*State, error) {
	return readGuardStateNL(id, true)
}

// runGuardTx runs, on a guarded network, one transaction on its guard
// table (its sets and chains made if missing, their rules left as they
// are) with what build adds.
func runGuardTx(ctx context.Context, n *api.Network, what string, build func(*knftables.Transaction)) error {
	if !Guarded(n) {
		return nil
	}
	nft, err := hostnet.NFT(knftables.BridgeFamily, n.ID)
	if err != nil {
		return err
	}
	tx := nft.NewTransaction()
	addGuardSets(tx, n)
	build(tx)
	if err := nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("network %q: %s: %w", n.ID, what, err)
	}
	return nil
}

// The impairments' chains: what the VMs send (every frame a port brings
// in) and what they are sent (every frame a port takes out), each a rule
// per impaired port; none without an impairment, so that the bridge's
// frames pay for no hook.
const (
	impairFrom = "impair-from"
	impairTo   = "impair-to"
)

// SetImpairments makes ps the impairments of n's ports: each port loses
// its share of frames each way, drawn at random per frame by the kernel
// (numgen). Ports not in ps lose none.
//
// With none, only chains that are there are deleted, and none there is no
// transaction at all: the controller gives every network its impairments
// on each full pass, and a chain deleted is a change its watch reports
// (netplane.WatchChanges), which asks for a full pass: adding and
// deleting the chains each time kept it passing without end. With some,
// nothing is written either while the chains are what the last write
// left (impairMemo): a write is a notice of a vmnetctl table, and the
// controller's resync leaves the ports unread only while there is none.
func SetImpairments(ctx context.Context, n *api.Network, ps []nettypes.PortImpairment) error {
	if !Guarded(n) {
		return nil
	}
	ps = slices.Clone(ps)
	slices.SortFunc(ps, func(a, b nettypes.PortImpairment) int { return strings.Compare(a.Port, b.Port) })
	var gone []string
	if len(ps) == 0 {
		chains, err := hostnet.TableChains(knftables.BridgeFamily, hostnet.TableName(n.ID))
		if err != nil {
			return fmt.Errorf("network %q: the impairments: %w", n.ID, err)
		}
		for _, c := range chains {
			if c == impairFrom || c == impairTo {
				gone = append(gone, c)
			}
		}
		if len(gone) == 0 {
			return nil
		}
	}
	want := fmt.Sprint(ps)
	if len(ps) > 0 {
		if m, ok := impairMemo.Load(n.ID); ok {
			if now, _, clean, err := impairRules(n.ID); err == nil && clean && m == (impairWritten{want, now}) {
				return nil
			}
		}
	}
	impairMemo.Delete(n.ID)
	before, err := hostnet.NFTGeneration()
	if err != nil {
		return err
	}
	err = runGuardTx(ctx, n, "the impairments", func(tx *knftables.Transaction) {
		for _, c := range gone {
			tx.Delete(&knftables.Chain{Name: c})
		}
		for _, c := range []struct {
			name string
			hook knftables.BaseChainHook
		}{{impairFrom, knftables.PreroutingHook}, {impairTo, knftables.PostroutingHook}} {
			if len(ps) == 0 {
				break
			}
			chain := &knftables.Chain{Name: c.name, Type: knftables.PtrTo(knftables.FilterType), Hook: knftables.PtrTo(c.hook),
				Priority: knftables.PtrTo(knftables.FilterPriority), Policy: knftables.PtrTo(knftables.AcceptPolicy)}
			tx.Add(chain)
			tx.Flush(&knftables.Chain{Name: c.name})
		}
		for _, p := range ps {
			for _, c := range []struct {
				chain, dev string
				loss       uint32
			}{{impairFrom, "iifname", p.LossFromVM}, {impairTo, "oifname", p.LossToVM}} {
				switch {
				case c.loss >= api.LossScale: // all of them
					tx.Add(&knftables.Rule{Chain: c.chain, Rule: fmt.Sprintf("%s %q counter drop", c.dev, p.Port)})
				case c.loss > 0:
					tx.Add(&knftables.Rule{Chain: c.chain, Rule: fmt.Sprintf("%s %q numgen random mod %d < %d counter drop", c.dev, p.Port, api.LossScale, c.loss)})
				}
			}
		}
	})
	if err != nil || len(ps) == 0 {
		return err
	}
	// What the kernel holds now is this write's alone if no other commit
	// came between (the transaction is one commit: one generation).
	if now, gen, clean, err := impairRules(n.ID); err == nil && clean && gen == before+1 {
		impairMemo.Store(n.ID, impairWritten{want, now})
	}
	return nil
}

// impairMemo is, by network, what SetImpairments last wrote and read back
// (impairWritten). Chains found as they were read back then, for the same
// impairments, are what a write would make again.
var impairMemo sync.Map

// impairWritten is the impairments written (want) and the chains the
// kernel held after (impairRules).
type impairWritten struct{ want, rules string }

// impairRules is network id's impairment chains as the kernel holds them:
// each chain's hook, priority, type and policy, and its rules, their
// expressions but the counters' values; gen is the generation read
// after, and clean false if another commit came during the read.
func impairRules(id string) (rules string, gen uint32, clean bool, err error) {
	before, err := hostnet.NFTGeneration()
	if err != nil {
		return "", 0, false, err
	}
	conn, err := nftables.New()
	if err != nil {
		return "", 0, false, fmt.Errorf("nftables: %w", err)
	}
	table := &nftables.Table{Name: hostnet.TableName(id), Family: nftables.TableFamilyBridge}
	chains, err := conn.ListChainsOfTableFamily(nftables.TableFamilyBridge)
	if err != nil {
		return "", 0, false, err
	}
	var b strings.Builder
	for _, ch := range chains {
		if ch.Table == nil || ch.Table.Name != table.Name || (ch.Name != impairFrom && ch.Name != impairTo) {
			continue
		}
		fmt.Fprintf(&b, "chain %s %v %v %v %v\n", ch.Name, deref(ch.Hooknum), deref(ch.Priority), ch.Type, deref(ch.Policy))
		rs, err := conn.GetRules(table, ch)
		if err != nil {
			return "", 0, false, err
		}
		for _, r := range rs {
			fmt.Fprintf(&b, "rule %x", r.UserData)
			for _, e := range r.Exprs {
				if _, ok := e.(*expr.Counter); ok {
					e = &expr.Counter{}
				}
				fmt.Fprintf(&b, " %T%+v", e, e)
			}
			b.WriteByte('\n')
		}
	}
	after, err := hostnet.NFTGeneration()
	if err != nil {
		return "", 0, false, err
	}
	return b.String(), after, after == before, nil
}

// deref is *p, or p's zero value if p is nil.
func deref[T any](p *T) (v T) {
	if p != nil {
		v = *p
	}
	return v
}

// BindAddress lets the VM with mac send from ip on network n, whatever its
// DHCP server says: for VMs whose addresses are static and that run
// without a controller (tests, benchmarks). A controller's guard removes
// the pair at its next resync unless the network bound it.
func BindAddress(ctx context.Context, n *api.Network, mac net.HardwareAddr, ip netip.Addr) error {
	nft, err := hostnet.NFT(knftables.BridgeFamily, n.ID)
	if err != nil {
		return err
	}
	tx := nft.NewTransaction()
	addGuardSets(tx, n)
	tx.Add(&knftables.Element{Set: SetAddrs, Key: []string{mac.String(), ip.String()}})
	return nft.Run(ctx, tx)
}

// Binding is a (MAC, IPv4) pair of the guard's address set.
type Binding struct {
	MAC string
	IP  netip.Addr
}

// AddrGuard keeps the guard's address set equal to what the network's
// allocator bound: reservations, fixed addresses and unexpired leases. It
// is told of each DHCP change (syncMAC, before the client hears of it) and
// goes over everything now and then (syncAll), which removes the pairs of
// leases that expired.
type AddrGuard struct {
	id    string
	alloc *leases.Allocator
	log   *slog.Logger
	nft   knftables.Interface
	inNS  func(func() error) error

	mu        sync.Mutex
	installed map[string][]netip.Addr // by MAC; nil until read from the kernel
	// trust is what Sync's reads of the set found (a digest of
	// installed) at which nftables generation: a Sync at a generation it
	// can trust keeps installed without reading the set again (an idle
	// network's resync is one small request, not a dump). A write, or a
	// read outside Sync, forgets it.
	trust   genTrust
	seed    maphash.Seed
	failLog guestlog.Limit
}

func NewAddrGuard(n *api.Network, alloc *leases.Allocator, log *slog.Logger, inNS func(func() error) error) (*AddrGuard, error) {
	nft, err := hostnet.NFT(knftables.BridgeFamily, n.ID)
	if err != nil {
		return nil, err
	}
	return &AddrGuard{id: n.ID, alloc: alloc, log: log, nft: nft, inNS: inNS, seed: maphash.MakeSeed()}, nil
}

// Installed is the address pairs the kernel's guard holds, by MAC, read
// from it.
func (g *AddrGuard) Installed(ctx context.Context) (map[string][]netip.Addr, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	err := g.load(ctx)
	return g.installed, err
}

// load reads the set from the kernel, once: a restarted controller finds
// what the one before it installed.
func (g *AddrGuard) load(ctx context.Context) error {
	if g.installed != nil {
		return nil
	}
	// Through netlink, in this process: every resync of every network
	// read it, and through the nft command (knftables' ListElements) that
	// was a process started a network every 15 s, an idle controller's
	// most frequent wake at 10,000 VMs.
	var elems []nftables.SetElement
	err := g.inNS(func() (err error) {
		elems, err = SetElements(g.id, SetAddrs)
		return err
	})
	if err != nil {
		return err
	}
	g.installed = map[string][]netip.Addr{}
	for _, e := range elems {
		// ether_addr . ipv4_addr: the MAC, padded to 8 bytes, then the
		// address.
		if len(e.Key) != 12 {
			continue
		}
		mac := net.HardwareAddr(e.Key[:6]).String()
		g.installed[mac] = append(g.installed[mac], netip.AddrFrom4([4]byte(e.Key[8:12])))
	}
	return nil
}

// installedDigest is a digest of the pairs installed holds (elemHash).
func (g *AddrGuard) installedDigest() uint64 {
	var sum uint64
	var h maphash.Hash
	h.SetSeed(g.seed)
	n := 0
	for mac, ips := range g.installed {
		for _, ip := range ips {
			sum += elemHash(&h, mac, ip, 0)
			n++
		}
	}
	return sum + uint64(n)
}

// Change adds the pairs add and deletes del now, under the guard's lock,
// as a sync does; deleting a pair already gone is no error.
func (g *AddrGuard) Change(ctx context.Context, add, del []Binding) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.load(ctx); err != nil {
		return err
	}
	return g.apply(ctx, add, del)
}

// Apply changes the set by one transaction: add, then delete.
func (g *AddrGuard) apply(ctx context.Context, add, del []Binding) error {
	if len(add) == 0 && len(del) == 0 {
		return nil
	}
	g.trust.forget() // this commit moves the generation
	tx := g.nft.NewTransaction()
	for _, b := range add {
		tx.Add(&knftables.Element{Set: SetAddrs, Key: []string{b.MAC, b.IP.String()}})
	}
	for _, b := range del {
		hostnet.DeleteElement(tx, &knftables.Element{Set: SetAddrs, Key: []string{b.MAC, b.IP.String()}})
	}
	if err := g.inNS(func() error { return g.nft.Run(ctx, tx) }); err != nil {
		g.installed = nil // read it again next time
		return fmt.Errorf("network %q: updating the guard's addresses: %w", g.id, err)
	}
	for _, b := range add {
		g.installed[b.MAC] = append(g.installed[b.MAC], b.IP)
	}
	for _, b := range del {
		g.installed[b.MAC] = slices.DeleteFunc(g.installed[b.MAC], func(ip netip.Addr) bool { return ip == b.IP })
		if len(g.installed[b.MAC]) == 0 {
			delete(g.installed, b.MAC)
		}
	}
	return nil
}

// diff appends to add and del what makes have into want, for one MAC.
func diff(mac string, have, want []netip.Addr, add, del []Binding) ([]Binding, []Binding) {
	for _, ip := range want {
		if !slices.Contains(have, ip) {
			add = append(add, Binding{mac, ip})
		}
	}
	for _, ip := range have {
		if !slices.Contains(want, ip) {
			del = append(del, Binding{mac, ip})
		}
	}
	return add, del
}

// SyncMAC brings one MAC's pairs up to date.
func (g *AddrGuard) SyncMAC(ctx context.Context, mac net.HardwareAddr) {
	g.mu.Lock()
	defer g.mu.Unlock()
	err := g.load(ctx)
	if err == nil {
		m := mac.String()
		add, del := diff(m, g.installed[m], g.alloc.BoundTo(mac), nil, nil)
		// An address mac newly holds that another MAC held (a lease kept
		// for an attached VM, taken over when no other address was
		// left): the other MAC's pairs change in the same transaction.
		for _, b := range add {
			for other, ips := range g.installed {
				if other == m || !slices.Contains(ips, b.IP) {
					continue
				}
				if hw, perr := net.ParseMAC(other); perr == nil {
					add, del = diff(other, ips, g.alloc.BoundTo(hw), add, del)
				}
			}
		}
		err = g.apply(ctx, add, del)
	}
	g.LogFailure(err)
}

// SyncAll brings every pair up to date.
func (g *AddrGuard) SyncAll(ctx context.Context) error { return g.Sync(ctx, false) }

// Sync is syncAll; addOnly keeps what the allocator does not know yet (at
// a network's start, before the controller told it the VM files' fixed
// addresses: removing them would cut those VMs off until it does).
func (g *AddrGuard) Sync(ctx context.Context, addOnly bool) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	// From the kernel, not from what was installed (the guard table
	// may have been deleted and made again meanwhile, by drift and the
	// ports' pass's repair, its addresses with it), unless the nftables
	// generation says the set is what was read (genTrust). The
	// generation before the set: a commit between the two reads as a
	// change.
	began := time.Now()
	var gen uint32
	genErr := g.inNS(func() (err error) {
		gen, err = hostnet.NFTGeneration()
		return err
	})
	if genErr != nil || g.installed == nil || !g.trust.skip(gen, g.installedDigest()) {
		g.installed = nil
		if err := g.load(ctx); err != nil {
			g.trust.forget()
			return err
		}
		g.trust.read(gen, g.installedDigest(), genErr == nil, began)
	}
	want := g.alloc.Bound()
	var add, del []Binding
	for mac, ips := range want {
		add, del = diff(mac, g.installed[mac], ips, add, del)
	}
	for mac, ips := range g.installed {
		if _, ok := want[mac]; !ok {
			add, del = diff(mac, ips, nil, add, del)
		}
	}
	if addOnly {
		del = nil
	}
	return g.apply(ctx, add, del)
}

func (g *AddrGuard) LogFailure(err error) {
	if err == nil {
		return
	}
	if ok, n := g.failLog.Allow(g.alloc.Now()); ok {
		g.log.Error("guard: the VMs' addresses are not up to date; retrying later", "err", err, "suppressed", n)
	}
}

// ExpectedPort tells whether port is the port some attachment of network
// n is expected on (the controller's claims): `vmnetctl helper` under sudo
// may not take such a name, which would let it learn that VM's MAC.
func ExpectedPort(ctx context.Context, n *api.Network, port string) (bool, error) {
	if !Guarded(n) {
		return false, nil
	}
	st, err := ReadState(ctx, n.ID)
	if err != nil {
		return false, err
	}
	for pm := range st.Owns {
		if pm.Port == port {
			return true, nil
		}
	}
	return false, nil
}

// SetPartitionPairs makes the pairs (source MAC, destination MAC) whose
// frames n's guard drops exactly pairs, in one transaction: the
// controller gives every pair of VMs that n's partitions part, both ways.
// When the set holds them already (read through netlink) nothing is run:
// a controller gives them on every full pass, and each transaction ran
// nft, a process a network every 30 s.
func SetPartitionPairs(ctx context.Context, n *api.Network, pairs [][2]net.HardwareAddr) error {
	if !Guarded(n) {
		return nil
	}
	if same, err := partitionsAre(n.ID, pairs); err == nil && same {
		return nil
	}
	return runGuardTx(ctx, n, "the partitions", func(tx *knftables.Transaction) {
		tx.Flush(&knftables.Set{Name: SetPartitions})
		for _, p := range pairs {
			tx.Add(&knftables.Element{Set: SetPartitions, Key: []string{p[0].String(), p[1].String()}})
		}
	})
}

// partitionKey is an element of the partitions set: the two MACs, each
// padded to 8 bytes (a concatenation's fields take whole 32-bit words).
func partitionKey(p [2]net.HardwareAddr) string {
	var k [16]byte
	copy(k[:], p[0])
	copy(k[8:], p[1])
	return string(k[:])
}

// partitionsAre reports whether network id's partitions set holds pairs
// and nothing else.
func partitionsAre(id string, pairs [][2]net.HardwareAddr) (bool, error) {
	elems, err := hostnet.SetElements(nftables.TableFamilyBridge, id, SetPartitions)
	if err != nil {
		return false, err
	}
	want := make(map[string]bool, len(pairs))
	for _, p := range pairs {
		want[partitionKey(p)] = true
	}
	if len(elems) != len(want) {
		return false, nil
	}
	for _, e := range elems {
		if !want[string(e.Key)] {
			return false, nil
		}
	}
	return true, nil
}
