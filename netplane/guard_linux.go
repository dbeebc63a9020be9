package netplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/guestlog"
	"github.com/vmnetctl/vmnetctl/leases"
	"sigs.k8s.io/knftables"
)

// The guard: anti-spoofing for the VM ports of shared and host networks,
// enforced by the kernel in the network's table of the bridge family (the
// same name as its inet table, and the same mark). It sees every frame a
// VM writes, on a socket through its helper or straight into a TAP, before
// the bridge learns or forwards it:
//
//	table bridge vmnetctl-<id>
//	  set addrs4       the (MAC, IPv4) pairs the network bound: DHCP
//	                   leases, reservations, fixed addresses (addrGuard)
//	  map ports        port name -> jump port-<port>
//	  chain prerouting iifname vmap @ports
//	  set mac-<port>   the port's one MAC (size 1): the VM file's, or
//	                   the first the VM sends from, learned by the kernel
//	  counter drops-<port>
//	  chain port-<port> the checks (portRules)
//
// A port that is not in the map (a port the user attached, a port whose
// attachment opted out) is not checked.
const (
	guardAddrs = "addrs4"
	guardPorts = "ports"
	guardHook  = "prerouting"
	// The MACs' exclusivity (ClaimPorts).
	guardClaimed  = "claimed"
	guardOwns     = "owns"
	guardExpected = "expected" // the MACs of owns, to look one up alone
	// The constant sets the ports' rules look up: named, not written in
	// each rule (an anonymous set belongs to one rule), so that a port's
	// chain can be copied rule by rule (clonePortGuard).
	guardL2Types = "l2types" // ARP, IPv4, IPv6
	// guardCurrent holds the ports guarded with this version's rules
	// (guardRulesVersion): a port of a running VM that an older vmnetctl
	// guarded is guarded again by the controller's pass (EnsurePorts), so
	// that a fix to the rules reaches the VMs that run through an upgrade.
	guardCurrent = "rules-v" + guardRulesVersion
)

// guardRulesVersion is the version of portRules: changed with them. 2:
// tagged frames are dropped first (issue 37), constant sets are named.
const guardRulesVersion = "2"

func guardChain(port string) string   { return "port-" + port }
func guardMACSet(port string) string  { return "mac-" + port }
func guardCounter(port string) string { return "drops-" + port }

// guarded reports whether network n guards its ports: shared and host
// networks, whose addresses vmnetctl hands out. A bridged network's LAN is
// its owner's to police.
func guarded(n *api.Network) bool { return n.Routed() }

// checksAddresses reports whether n's guard checks IPv4 sources: on every
// routed network: vmnetctl keeps its addresses (its allocator: leases,
// reservations and VM files' fixed addresses, with or without DHCP). With `dhcp: false` a VM's
// source must then be its fixed address (`ip:`) or a reservation: the
// address a VM gives itself is no one's to vouch for.
func checksAddresses(n *api.Network) bool { return n.Routed() }

// addGuardBase adds to tx n's guard table with its sets, map and hook,
// leaving the ports' chains alone; added again, it changes nothing.
func addGuardBase(tx *knftables.Transaction, n *api.Network) {
	mark := Mark(n.ID)
	tx.Add(&knftables.Table{Comment: &mark})
	tx.Add(&knftables.Set{Name: guardAddrs, Type: "ether_addr . ipv4_addr"})
	tx.Add(&knftables.Set{Name: guardClaimed, Type: "ether_addr", Flags: []knftables.SetFlag{knftables.DynamicFlag}})
	tx.Add(&knftables.Set{Name: guardOwns, Type: "ether_addr . ifname"})
	tx.Add(&knftables.Set{Name: guardExpected, Type: "ether_addr"})
	constSet(tx, guardL2Types, "ether_type", []string{"arp", "ip", "ip6"})
	addGuard6Sets(tx, n)
	tx.Add(&knftables.Map{Name: guardPorts, Type: "ifname : verdict"})
	tx.Add(&knftables.Set{Name: guardCurrent, Type: "ifname"})
	tx.Add(&knftables.Chain{Name: guardHook, Type: knftables.PtrTo(knftables.FilterType),
		Hook: knftables.PtrTo(knftables.PreroutingHook), Priority: knftables.PtrTo(knftables.FilterPriority),
		Policy: knftables.PtrTo(knftables.AcceptPolicy)})
	tx.Flush(&knftables.Chain{Name: guardHook})
	tx.Add(&knftables.Rule{Chain: guardHook, Rule: "iifname vmap @" + guardPorts})
}

// ensureGuardTable makes n's guard table, keeping the guards of ports that
// exist, and removes the guards of ports that do not (pruneGuards).
func ensureGuardTable(ctx context.Context, n *api.Network) error {
	if !guarded(n) {
		return nil
	}
	mark, exists, err := tableMark(ctx, knftables.BridgeFamily, TableName(n.ID))
	if err != nil {
		return err
	}
	err = runGuardTx(ctx, n, "installing nftables table bridge "+TableName(n.ID), func(tx *knftables.Transaction) {
		// A table with another mark (an older vmnetctl's, without an
		// owner; checkTableOwner refused any other) is made again with
		// this one: its ports are guarded again by the controller
		// (EnsurePorts).
		if exists && mark != Mark(n.ID) {
			tx.Delete(&knftables.Table{})
			addGuardBase(tx, n)
		}
		addGuardTemplate(tx, n)
	})
	if err != nil {
		return err
	}
	return pruneGuards(n.ID)
}

// checkGuardTable is Check's part for n's guard table: there, marked, with
// its hook.
func checkGuardTable(ctx context.Context, n *api.Network) []error {
	if !guarded(n) {
		return nil
	}
	// The table's comment and its hook chain's rules, not the whole table
	// (every port's chain): a pass checks every network.
	mark, exists, err := tableMark(ctx, knftables.BridgeFamily, TableName(n.ID))
	if err != nil {
		return []error{err}
	}
	hooked := false
	if exists {
		if hooked, err = hasVmapRule(knftables.BridgeFamily, TableName(n.ID), guardHook, guardPorts); err != nil {
			return []error{err}
		}
	}
	switch {
	case !exists:
		return []error{fmt.Errorf("network %q: nftables table bridge %s (the ports' guard) does not exist", n.ID, TableName(n.ID))}
	case mark != Mark(n.ID):
		return []error{fmt.Errorf("network %q: nftables table bridge %s is not marked as vmnetctl's", n.ID, TableName(n.ID))}
	case !hooked:
		return []error{fmt.Errorf("network %q: nftables table bridge %s lacks its hook", n.ID, TableName(n.ID))}
	}
	return nil
}

// dhcpPortRate is the most DHCP requests a guarded port sends on: a
// booting client sends 2 to 4, a renewing one 1, and the server answers a
// client at most 2 a second after a burst of 10 (dhcpRate).
const dhcpPortRate = "20/second burst 40 packets"

// portRules are the checks of a port's chain, in order. mac is the port's
// MAC when the attachment names it; nil learns the first the VM sends from.
func portRules(n *api.Network, port string, learn bool) []string {
	return guardRules(n, guardMACSet(port), guardCounter(port), learn)
}

// guardRules are portRules with the port's MAC set and drop counter named.
func guardRules(n *api.Network, macSet, counter string, learn bool) []string {
	drop := fmt.Sprintf("counter name %q drop", counter)
	macs := "@" + macSet
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
	rs := []string{"ether type != @" + guardL2Types + " " + drop}
	if learn {
		// The set holds one MAC: adding a second fails, and the rule
		// does nothing more (the add to claimed after it is not run).
		// The port learns its own expected MAC, or one no port of the
		// network holds or is expected to hold, which it then claims:
		// never another VM's.
		claim := " add " + macs + " { ether saddr } add @" + guardClaimed + " { ether saddr }"
		rs = append(rs,
			"ether saddr != "+macs+" ether saddr . iifname @"+guardOwns+claim,
			"ether saddr != "+macs+" ether saddr != @"+guardClaimed+claim)
	}
	rs = append(rs,
		"ether saddr != "+macs+" "+drop,
		"arp saddr ether != "+macs+" "+drop)
	if checksAddresses(n) {
		// 0.0.0.0 is an address probe (RFC 5227), before DHCP's ACK.
		rs = append(rs, "arp saddr ip != 0.0.0.0 ether saddr . arp saddr ip != @"+guardAddrs+" "+drop)
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
		"ether type ip udp dport 67 limit rate over "+dhcpPortRate+" "+drop,
		"ether type ip ip saddr 0.0.0.0 udp sport 68 udp dport 67 accept")
	if checksAddresses(n) {
		rs = append(rs,
			"ether type ip ether saddr . ip saddr @"+guardAddrs+" accept",
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

// GuardPort makes network n check every frame that arrives on its port
// name: one MAC (mac, or with mac nil the first the VM sends from that is
// the port's expected MAC or nobody's, until the port is guarded again),
// IPv4 sources and ARP senders the network bound to that MAC (or 0.0.0.0
// for DHCP and probes), no DHCP or DHCPv6 answers, no router
// advertisements, only IPv4, ARP and IPv6. It replaces whatever guarded a
// port of that name before, and releases the MAC that guard learned. It
// refuses a mac that another port of the network holds or is expected to
// hold (claimed, and neither this port's expected MAC nor the one it
// holds). CreatePort calls it for a TAP before the TAP joins the bridge,
// so no frame of it goes unchecked.
func GuardPort(ctx context.Context, n *api.Network, port string, mac net.HardwareAddr) error {
	if !guarded(n) {
		return nil
	}
	var m string
	if mac != nil {
		m = mac.String()
	} else if Owner() == "" {
		// A standalone helper's learning port may learn its VM's MAC,
		// which the guard of a port that is gone may still hold: gone
		// guards go first. A controller's port learns its expected MAC
		// (owns) whoever held it, and the controller prunes on its
		// passes (ClaimPorts); a port with its MAC prunes only when the
		// MAC is taken, below. So a controller's helper starts at the
		// same cost however many ports the network has.
		if err := pruneGuards(n.ID); err != nil {
			return err
		}
	}
	ps, err := readPortState(ctx, n.ID, port, m)
	if err != nil {
		return err
	}
	if mac == nil {
		// Through netlink, from the template: what a controller's port
		// costs does not grow with the network's ports.
		if err := guardPortByClone(n, port, ps); !errors.Is(err, errNoTemplate) {
			return err
		}
	}
	if m != "" && !ps.mine && ps.claimed {
		// Some port holds it: one that is gone (a helper that exited)
		// releases it once its guard is pruned, so that a helper started
		// again under another TAP name takes its VM's MAC again.
		if err := pruneGuards(n.ID); err != nil {
			return err
		}
		if ps, err = readPortState(ctx, n.ID, port, m); err != nil {
			return err
		}
		if !ps.mine && ps.claimed {
			holder := ""
			if st, err := readGuardState(ctx, n.ID); err == nil {
				holder = st.holder(m, port)
			}
			return fmt.Errorf("network %q: guarding port %s: MAC %s is another VM port's%s: a port may not take it", n.ID, port, m, holder)
		}
	}
	mine := ps.mine
	return runGuardTx(ctx, n, "guarding port "+port, func(tx *knftables.Transaction) {
		// Replace the old guard whole, its learned MAC with it.
		if ps.exists() {
			deleteGuard(tx, port, ps.held, ps.heldExpected, m)
		}
		g := guardObjects(port)
		tx.Add(g.set)
		if mac != nil {
			tx.Add(&knftables.Element{Set: g.set.Name, Key: []string{m}})
			claim := &knftables.Element{Set: guardClaimed, Key: []string{m}}
			if mine {
				tx.Add(claim)
			} else {
				// Fails, and the port stays unguarded, should another
				// port have taken it since the read.
				tx.Create(claim)
			}
		}
		tx.Add(g.counter)
		tx.Add(g.chain)
		for _, r := range portRules(n, port, mac == nil) {
			tx.Add(&knftables.Rule{Chain: g.chain.Name, Rule: r})
		}
		tx.Add(g.elem)
		tx.Add(g.current)
	})
}

// UnguardPort removes the guard of port name, if n has one: its frames are
// no longer checked. For an attachment that opts out.
func UnguardPort(ctx context.Context, n *api.Network, port string) error {
	if !guarded(n) {
		return nil
	}
	ps, err := readPortState(ctx, n.ID, port, "")
	if err != nil {
		return err
	}
	return runGuardTx(ctx, n, "removing the guard of port "+port, func(tx *knftables.Transaction) {
		deleteGuard(tx, port, ps.held, ps.heldExpected, "")
	})
}

// ClaimPorts makes expected (port name -> the MAC its attachment gives the
// VM, derived or pinned) the network's owns, and claimed the expected MACs
// and those the ports hold, in one transaction: a learning port may then
// learn its own expected MAC, and no port another's, even before that
// VM sent a frame. A port that learned another port's expected MAC (before
// it was claimed) forgets it: its frames from it are dropped. The
// controller calls it on every pass, before it starts helpers; it changes
// nothing when the sets are already so.
func ClaimPorts(ctx context.Context, n *api.Network, expected map[string]net.HardwareAddr) error {
	if !guarded(n) {
		return nil
	}
	gone, err := goneGuards(n.ID)
	if err != nil {
		return err
	}
	if len(gone) > pruneChunk {
		// Many at once (a `down`): in batches of their own, first.
		if err := pruneGone(n.ID, gone); err != nil {
			return err
		}
		gone = nil
	}
	// The guards of the ports that went are removed in the batch that
	// changes the claims: a commit that deletes waits for the kernel's
	// readers, once rather than twice for a VM that leaves.
	isGone := map[string]bool{}
	for _, port := range gone {
		isGone[port] = true
	}
	owns, owner := map[portMAC]bool{}, map[string]string{}
	for port, mac := range expected {
		owns[portMAC{mac.String(), port}] = true
		owner[mac.String()] = port
	}
	expectedMACs := map[string]bool{}
	for mac := range owner {
		expectedMACs[mac] = true
	}
	// Without the ports' MACs first: what they learned matters only when
	// a MAC stops being expected (it stays claimed if a port holds it) or
	// a newly expected one is claimed already (a port that learned it
	// loses it). Attaching VMs needs neither, and so costs the same
	// however many ports there are.
	st, sets, err := readGuardStateNL(n.ID, false)
	if err != nil {
		return err
	}
	if sets[guardOwns] == nil || sets[guardClaimed] == nil || sets[guardExpected] == nil {
		// A table without them (none yet, or an older vmnetctl's): made
		// first.
		if err := runGuardTx(ctx, n, "making the guard's sets", func(*knftables.Transaction) {}); err != nil {
			return err
		}
		if st, sets, err = readGuardStateNL(n.ID, false); err != nil {
			return err
		}
	}
	full, stillHeld, err := stillHeldBy(n.ID, st, expectedMACs, isGone)
	if err != nil {
		return err
	}
	// What changes, written through netlink: a VM more or less costs its
	// own elements, not nft's read of the whole table.
	var ch claimsChange
	if !full {
		// The expected MACs nobody holds yet are claimed; those no
		// longer expected and no longer held leave.
		ch.delExpected, ch.addExpected = setDiff(st.expectedMACs, expectedMACs)
		_, ch.addClaimed = setDiff(st.claimed, expectedMACs)
		for _, mac := range ch.delExpected {
			if st.claimed[mac] && !stillHeld[mac] {
				ch.delClaimed = append(ch.delClaimed, mac)
			}
		}
	} else {
		if st, sets, err = readGuardStateNL(n.ID, true); err != nil {
			return err
		}
		for port := range isGone {
			delete(st.learned, port) // (its guard goes below)
		}
		// Claimed: what the ports hold and the expected MACs; a port
		// that holds another port's expected MAC loses it.
		claimed := map[string]bool{}
		for port, mac := range st.learned {
			if o, ok := owner[mac]; ok && o != port {
				ch.evict = append(ch.evict, portMAC{mac, port})
				continue
			}
			claimed[mac] = true
		}
		for mac := range owner {
			claimed[mac] = true
		}
		ch.delExpected, ch.addExpected = setDiff(st.expectedMACs, expectedMACs)
		ch.delClaimed, ch.addClaimed = setDiff(st.claimed, claimed)
	}
	ch.delOwns, ch.addOwns = setDiff(st.owns, owns)
	if ch.empty() && len(gone) == 0 {
		return nil
	}
	return applyClaims(n.ID, sets, ch, gone, expectedMACs)
}

// stillHeldBy tells, of the MACs st expects that expected no longer
// holds, those a port still holds (not one of gone, whose guards go): they
// stay claimed. A MAC no longer expected can be held only by the port that
// owned it (no other could learn a claimed MAC): its set alone is read.
// full is true when only every port's set can tell: a newly expected MAC
// is claimed already (some port learned it), or a MAC no longer expected
// has no owner recorded.
func stillHeldBy(id string, st *guardState, expected, gone map[string]bool) (full bool, stillHeld map[string]bool, err error) {
	for mac := range expected {
		if !st.expectedMACs[mac] && st.claimed[mac] {
			return true, nil, nil
		}
	}
	ownerOf := map[string][]string{}
	for p := range st.owns {
		ownerOf[p.mac] = append(ownerOf[p.mac], p.port)
	}
	stillHeld = map[string]bool{}
	for mac := range st.expectedMACs {
		if expected[mac] {
			continue
		}
		if len(ownerOf[mac]) == 0 {
			return true, nil, nil
		}
		for _, port := range ownerOf[mac] {
			if gone[port] {
				continue // its guard goes with this change
			}
			held, err := readHeld(id, port)
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

// portMAC is a MAC (as text) and a port's name.
type portMAC struct{ mac, port string }

// guardState is what a network's guard table holds of its MACs.
type guardState struct {
	learned      map[string]string // port -> the MAC its set holds (learned or pinned)
	claimed      map[string]bool
	owns         map[portMAC]bool
	expectedMACs map[string]bool
}

// holder names, for an error, the port other than port that holds or is
// expected to hold mac.
func (st *guardState) holder(mac, port string) string {
	for p, m := range st.learned {
		if m == mac && p != port {
			return " (port " + p + ")"
		}
	}
	for p := range st.owns {
		if p.mac == mac && p.port != port {
			return " (port " + p.port + ")"
		}
	}
	return ""
}

// readGuardState reads the MACs of network id's guard table, all of them
// (readGuardStateNL); all empty without the table. For a controller's pass
// and for errors: GuardPort reads only its own port's (readPortState).
func readGuardState(_ context.Context, id string) (*guardState, error) {
	st, _, err := readGuardStateNL(id, true)
	return st, err
}

// portState is what GuardPort and UnguardPort need to know of network
// id's guard about one port and one MAC, read element by element: what it
// costs does not grow with the network's ports.
type portState struct {
	set          bool   // the port's MAC set exists
	rules        int    // the rules of the port's chain (0: no chain)
	held         string // the MAC the port's set holds, "" for none
	heldExpected bool   // held is some port's expected MAC
	heldOwned    bool   // held is this port's expected MAC (owns)
	mine         bool   // mac is the port's expected MAC, or the one it holds
	claimed      bool   // mac is claimed: some port holds it or is expected to
}

// exists tells whether the port has a guard, or a part of one to delete:
// its MAC set, or its chain with rules (a chain without rules is made
// again as it is).
func (ps portState) exists() bool { return ps.set || ps.rules > 0 }

// readPortState reads port's guard and what the guard says of mac ("" for
// none) on network id.
func readPortState(ctx context.Context, id, port, mac string) (portState, error) {
	var ps portState
	var err error
	if ps.set, ps.rules, err = guardParts(id, port); err != nil {
		return ps, err
	}
	if ps.set {
		if ps.held, err = readHeld(id, port); err != nil {
			return ps, err
		}
	}
	has := func(set string, key []byte) (ok bool) {
		if err == nil {
			ok, err = hasElement(id, set, key)
		}
		return ok
	}
	if hw, perr := net.ParseMAC(ps.held); perr == nil {
		ps.heldExpected = has(guardExpected, hw)
		ps.heldOwned = ps.heldExpected && has(guardOwns, ownsKey(portMAC{ps.held, port}))
	}
	if hw, perr := net.ParseMAC(mac); perr == nil {
		ps.mine = ps.held == mac || has(guardOwns, ownsKey(portMAC{mac, port}))
		ps.claimed = !ps.mine && has(guardClaimed, hw)
	}
	return ps, err
}

// runGuardTx runs, on a guarded network, one transaction on its guard
// table (made if missing) with what build adds.
func runGuardTx(ctx context.Context, n *api.Network, what string, build func(*knftables.Transaction)) error {
	if !guarded(n) {
		return nil
	}
	nft, err := newNFT(knftables.BridgeFamily, n.ID)
	if err != nil {
		return err
	}
	tx := nft.NewTransaction()
	addGuardBase(tx, n)
	build(tx)
	if err := nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("network %q: %s: %w", n.ID, what, err)
	}
	return nil
}

// guard is the objects of one port's guard.
type guard struct {
	chain   *knftables.Chain
	set     *knftables.Set
	elem    *knftables.Element
	counter *knftables.Counter
	current *knftables.Element // in guardCurrent
}

func guardObjects(port string) guard {
	chain := &knftables.Chain{Name: guardChain(port)}
	return guard{
		chain: chain,
		set: &knftables.Set{Name: guardMACSet(port), Type: "ether_addr", Size: knftables.PtrTo(uint64(1)),
			Flags: []knftables.SetFlag{knftables.DynamicFlag}},
		elem:    &knftables.Element{Map: guardPorts, Key: []string{quoteIfname(port)}, Value: []string{"jump " + chain.Name}},
		counter: &knftables.Counter{Name: guardCounter(port)},
		current: &knftables.Element{Set: guardCurrent, Key: []string{quoteIfname(port)}},
	}
}

// deleteGuard adds to tx the deletion of port's guard, existing or not
// (each object is added first, so that its delete finds it), its drop
// counter kept. The MAC the port held (held, "" for none) leaves claimed,
// unless it is some port's expected MAC (heldExpected) or keep: a new VM,
// or this port's VMM started again with another MAC, may then take it.
func deleteGuard(tx *knftables.Transaction, port, held string, heldExpected bool, keep string) {
	if mac := held; mac != "" && mac != keep && !heldExpected {
		claim := &knftables.Element{Set: guardClaimed, Key: []string{mac}}
		tx.Add(claim)
		tx.Delete(claim)
	}
	g := guardObjects(port)
	tx.Add(g.set)
	tx.Add(g.chain)
	tx.Add(g.elem)
	tx.Add(g.current)
	tx.Delete(g.current)
	tx.Delete(g.elem)
	tx.Delete(g.chain)
	tx.Delete(g.set)
}

// pruneGuards removes the guards of ports that no longer exist (a helper's
// TAP goes with its fd; its guard stays). A guard is deleted by one of its
// rules' handles in the same transaction: should a new port of the same
// name have been guarded since the check (a new chain, new handles), the
// transaction fails and the new guard stays.
func pruneGuards(id string) error {
	gone, err := goneGuards(id)
	if err != nil || len(gone) == 0 {
		return err
	}
	return pruneGone(id, gone)
}

// goneGuards is the ports of network id that have a guard and no link.
func goneGuards(id string) ([]string, error) {
	chains, err := tableChains(knftables.BridgeFamily, TableName(id)) // none without the table
	if err != nil {
		return nil, fmt.Errorf("network %q: listing the guards: %w", id, err)
	}
	// Each port's link looked up by its name, not a dump of every link.
	links, err := openLinkNames()
	if err != nil {
		return nil, fmt.Errorf("network %q: looking up the ports' links: %w", id, err)
	}
	defer links.close()
	var gone []string
	for _, c := range chains {
		if port, ok := strings.CutPrefix(c, "port-"); ok && !links.exists(port) {
			gone = append(gone, port)
		}
	}
	return gone, nil
}

// pruneGone removes the guards of gone, ports of network id that are gone
// (pruneGuardsNL), with the guard's expected MACs as they are.
func pruneGone(id string, gone []string) error {
	elems, err := guardSetElements(id, guardExpected)
	if err != nil {
		return err
	}
	expected := map[string]bool{}
	for _, e := range elems {
		if len(e.Key) >= 6 {
			expected[net.HardwareAddr(e.Key[:6]).String()] = true
		}
	}
	return pruneGuardsNL(id, gone, expected)
}

// quoteIfname is an interface name as an nft string literal.
func quoteIfname(name string) string { return `"` + name + `"` }

// guardDrops returns the frames each guarded port of network id dropped,
// by port name.
// ports, if not nil, are the ports asked about: their counters alone are
// read, one request each, not the thousand of a fleet's network.
func guardDrops(ctx context.Context, id string, ports []string) (map[string]uint64, error) {
	var counters map[string]uint64
	var err error
	if ports == nil {
		counters, err = namedCounters(ctx, knftables.BridgeFamily, id, guardCounter(""))
	} else {
		names := make([]string, len(ports))
		for i, port := range ports {
			names[i] = guardCounter(port)
		}
		counters, err = countersNamed(knftables.BridgeFamily, id, names)
	}
	drops := map[string]uint64{}
	for name, n := range counters {
		drops[strings.TrimPrefix(name, guardCounter(""))] = n
	}
	return drops, err
}

// BindAddress lets the VM with mac send from ip on network n, whatever its
// DHCP server says: for VMs whose addresses are static and that run
// without a controller (tests, benchmarks). A controller's guard removes
// the pair at its next resync unless the network bound it.
func BindAddress(ctx context.Context, n *api.Network, mac net.HardwareAddr, ip netip.Addr) error {
	nft, err := newNFT(knftables.BridgeFamily, n.ID)
	if err != nil {
		return err
	}
	tx := nft.NewTransaction()
	addGuardBase(tx, n)
	tx.Add(&knftables.Element{Set: guardAddrs, Key: []string{mac.String(), ip.String()}})
	return nft.Run(ctx, tx)
}

// binding is a (MAC, IPv4) pair of the guard's address set.
type binding struct {
	mac string
	ip  netip.Addr
}

// addrGuard keeps the guard's address set equal to what the network's
// allocator bound: reservations, fixed addresses and unexpired leases. It
// is told of each DHCP change (syncMAC, before the client hears of it) and
// goes over everything now and then (syncAll), which removes the pairs of
// leases that expired.
type addrGuard struct {
	id    string
	alloc *leases.Allocator
	log   *slog.Logger
	nft   knftables.Interface
	inNS  func(func() error) error

	mu        sync.Mutex
	installed map[string][]netip.Addr // by MAC; nil until read from the kernel
	failLog   guestlog.Limit
}

func newAddrGuard(n *api.Network, alloc *leases.Allocator, log *slog.Logger, inNS func(func() error) error) (*addrGuard, error) {
	nft, err := newNFT(knftables.BridgeFamily, n.ID)
	if err != nil {
		return nil, err
	}
	return &addrGuard{id: n.ID, alloc: alloc, log: log, nft: nft, inNS: inNS}, nil
}

// load reads the set from the kernel, once: a restarted controller finds
// what the one before it installed.
func (g *addrGuard) load(ctx context.Context) error {
	if g.installed != nil {
		return nil
	}
	var elems []*knftables.Element
	err := g.inNS(func() (err error) {
		elems, err = g.nft.ListElements(ctx, "set", guardAddrs)
		return err
	})
	if err != nil && !knftables.IsNotFound(err) {
		return fmt.Errorf("network %q: reading the guard's addresses: %w", g.id, err)
	}
	g.installed = map[string][]netip.Addr{}
	for _, e := range elems {
		if len(e.Key) != 2 {
			continue
		}
		mac, err1 := net.ParseMAC(e.Key[0])
		ip, err2 := netip.ParseAddr(e.Key[1])
		if err1 == nil && err2 == nil {
			g.installed[mac.String()] = append(g.installed[mac.String()], ip)
		}
	}
	return nil
}

// apply changes the set by one transaction: add, then delete.
func (g *addrGuard) apply(ctx context.Context, add, del []binding) error {
	if len(add) == 0 && len(del) == 0 {
		return nil
	}
	tx := g.nft.NewTransaction()
	for _, b := range add {
		tx.Add(&knftables.Element{Set: guardAddrs, Key: []string{b.mac, b.ip.String()}})
	}
	for _, b := range del {
		deleteElement(tx, &knftables.Element{Set: guardAddrs, Key: []string{b.mac, b.ip.String()}})
	}
	if err := g.inNS(func() error { return g.nft.Run(ctx, tx) }); err != nil {
		g.installed = nil // read it again next time
		return fmt.Errorf("network %q: updating the guard's addresses: %w", g.id, err)
	}
	for _, b := range add {
		g.installed[b.mac] = append(g.installed[b.mac], b.ip)
	}
	for _, b := range del {
		g.installed[b.mac] = slices.DeleteFunc(g.installed[b.mac], func(ip netip.Addr) bool { return ip == b.ip })
		if len(g.installed[b.mac]) == 0 {
			delete(g.installed, b.mac)
		}
	}
	return nil
}

// diff appends to add and del what makes have into want, for one MAC.
func diff(mac string, have, want []netip.Addr, add, del []binding) ([]binding, []binding) {
	for _, ip := range want {
		if !slices.Contains(have, ip) {
			add = append(add, binding{mac, ip})
		}
	}
	for _, ip := range have {
		if !slices.Contains(want, ip) {
			del = append(del, binding{mac, ip})
		}
	}
	return add, del
}

// syncMAC brings one MAC's pairs up to date.
func (g *addrGuard) syncMAC(ctx context.Context, mac net.HardwareAddr) {
	g.mu.Lock()
	defer g.mu.Unlock()
	err := g.load(ctx)
	if err == nil {
		m := mac.String()
		add, del := diff(m, g.installed[m], g.alloc.BoundTo(mac), nil, nil)
		err = g.apply(ctx, add, del)
	}
	g.logFailure(err)
}

// syncAll brings every pair up to date.
func (g *addrGuard) syncAll(ctx context.Context) error { return g.sync(ctx, false) }

// sync is syncAll; addOnly keeps what the allocator does not know yet (at
// a network's start, before the controller told it the VM files' fixed
// addresses: removing them would cut those VMs off until it does).
func (g *addrGuard) sync(ctx context.Context, addOnly bool) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	// From the kernel each time, not from what was installed: the guard
	// table may have been deleted and made again meanwhile (drift, its
	// repair by the ports' pass), its addresses with it.
	g.installed = nil
	if err := g.load(ctx); err != nil {
		return err
	}
	want := g.alloc.Bound()
	var add, del []binding
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

func (g *addrGuard) logFailure(err error) {
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
	if !guarded(n) {
		return false, nil
	}
	st, err := readGuardState(ctx, n.ID)
	if err != nil {
		return false, err
	}
	for pm := range st.owns {
		if pm.port == port {
			return true, nil
		}
	}
	return false, nil
}
