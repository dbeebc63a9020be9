package netplane

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/vmnetctl/vmnetctl/api"
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
)

func guardChain(port string) string   { return "port-" + port }
func guardMACSet(port string) string  { return "mac-" + port }
func guardCounter(port string) string { return "drops-" + port }

// guarded reports whether network n guards its ports: shared and host
// networks, whose addresses vmnetctl hands out. A bridged network's LAN is
// its owner's to police.
func guarded(n *api.Network) bool { return n.Routed() }

// checksAddresses reports whether n's guard checks IPv4 sources: only with
// vmnetctl's DHCP server, which knows every address it bound.
func checksAddresses(n *api.Network) bool { return n.Routed() && n.DHCP }

// addGuardBase adds to tx n's guard table with its sets, map and hook,
// leaving the ports' chains alone; added again, it changes nothing.
func addGuardBase(tx *knftables.Transaction, n *api.Network) {
	mark := Mark(n.ID)
	tx.Add(&knftables.Table{Comment: &mark})
	tx.Add(&knftables.Set{Name: guardAddrs, Type: "ether_addr . ipv4_addr"})
	addGuard6Sets(tx, n)
	tx.Add(&knftables.Map{Name: guardPorts, Type: "ifname : verdict"})
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
	})
	if err != nil {
		return err
	}
	return pruneGuards(ctx, n.ID)
}

// checkGuardTable is Check's part for n's guard table: there, marked, with
// its hook.
func checkGuardTable(ctx context.Context, n *api.Network) []error {
	if !guarded(n) {
		return nil
	}
	listing, err := tableRuleset(ctx, knftables.BridgeFamily, n.ID)
	switch {
	case err != nil:
		return []error{err}
	case listing == "":
		return []error{fmt.Errorf("network %q: nftables table bridge %s (the ports' guard) does not exist", n.ID, TableName(n.ID))}
	case !strings.Contains(listing, "comment \""+Mark(n.ID)+"\""):
		return []error{fmt.Errorf("network %q: nftables table bridge %s is not marked as vmnetctl's", n.ID, TableName(n.ID))}
	case !strings.Contains(listing, "\t\tiifname vmap @"+guardPorts+"\n"):
		return []error{fmt.Errorf("network %q: nftables table bridge %s lacks its hook", n.ID, TableName(n.ID))}
	}
	return nil
}

// portRules are the checks of a port's chain, in order. mac is the port's
// MAC when the attachment names it; nil learns the first the VM sends from.
func portRules(n *api.Network, port string, learn bool) []string {
	drop := fmt.Sprintf("counter name %q drop", guardCounter(port))
	macs := "@" + guardMACSet(port)
	var rs []string
	if learn {
		// The set holds one MAC: adding a second fails, and the rule
		// does nothing more.
		rs = append(rs, "ether saddr != "+macs+" add "+macs+" { ether saddr }")
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
		"ip saddr 0.0.0.0 udp sport 68 udp dport 67 accept")
	if checksAddresses(n) {
		rs = append(rs,
			"ether saddr . ip saddr @"+guardAddrs+" accept",
			"ether type ip "+drop)
	} else {
		rs = append(rs, "ether type ip accept")
	}
	rs = append(rs,
		// Nor does it advertise routes or answer DHCPv6.
		"icmpv6 type { nd-router-advert, nd-redirect } "+drop,
		"ether type ip6 udp sport 547 "+drop,
		"ether type ip6 udp dport 546 "+drop)
	rs = append(rs, port6Rules(n, drop)...)
	// Nothing else: no VLAN tags, no STP, no other protocols.
	return append(rs, drop)
}

// GuardPort makes network n check every frame that arrives on its port
// name: one MAC (mac, or with mac nil the first the VM sends from, until
// the port is guarded again), IPv4 sources and ARP senders the network bound
// to that MAC (or 0.0.0.0 for DHCP and probes), no DHCP or DHCPv6 answers,
// no router advertisements, only IPv4, ARP and IPv6. It replaces whatever
// guarded a port of that name before. CreatePort calls it for a TAP before
// the TAP joins the bridge, so no frame of it goes unchecked.
func GuardPort(ctx context.Context, n *api.Network, port string, mac net.HardwareAddr) error {
	return runGuardTx(ctx, n, "guarding port "+port, func(tx *knftables.Transaction) {
		// Replace the old guard whole, its learned MAC with it.
		deleteGuard(tx, port)
		g := guardObjects(port)
		tx.Add(g.set)
		if mac != nil {
			tx.Add(&knftables.Element{Set: g.set.Name, Key: []string{mac.String()}})
		}
		tx.Add(g.counter)
		tx.Add(g.chain)
		for _, r := range portRules(n, port, mac == nil) {
			tx.Add(&knftables.Rule{Chain: g.chain.Name, Rule: r})
		}
		tx.Add(g.elem)
	})
}

// UnguardPort removes the guard of port name, if n has one: its frames are
// no longer checked. For an attachment that opts out.
func UnguardPort(ctx context.Context, n *api.Network, port string) error {
	return runGuardTx(ctx, n, "removing the guard of port "+port, func(tx *knftables.Transaction) { deleteGuard(tx, port) })
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
}

func guardObjects(port string) guard {
	chain := &knftables.Chain{Name: guardChain(port)}
	return guard{
		chain: chain,
		set: &knftables.Set{Name: guardMACSet(port), Type: "ether_addr", Size: knftables.PtrTo(uint64(1)),
			Flags: []knftables.SetFlag{knftables.DynamicFlag}},
		elem:    &knftables.Element{Map: guardPorts, Key: []string{quoteIfname(port)}, Value: []string{"jump " + chain.Name}},
		counter: &knftables.Counter{Name: guardCounter(port)},
	}
}

// deleteGuard adds to tx the deletion of port's guard, existing or not
// (each object is added first, so that its delete finds it), its drop
// counter kept.
func deleteGuard(tx *knftables.Transaction, port string) {
	g := guardObjects(port)
	tx.Add(g.set)
	tx.Add(g.chain)
	tx.Add(g.elem)
	tx.Delete(g.elem)
	tx.Delete(g.chain)
	tx.Delete(g.set)
}

// pruneGuards removes the guards of ports that no longer exist (a helper's
// TAP goes with its fd; its guard stays). A guard is deleted by one of its
// rules' handles in the same transaction: should a new port of the same
// name have been guarded since the check (a new chain, new handles), the
// transaction fails and the new guard stays.
func pruneGuards(ctx context.Context, id string) error {
	nft, err := newNFT(knftables.BridgeFamily, id)
	if err != nil {
		return err
	}
	chains, err := nft.List(ctx, "chains")
	if err != nil {
		return fmt.Errorf("network %q: listing the guards: %w", id, err)
	}
	for _, c := range chains {
		port, ok := strings.CutPrefix(c, "port-")
		if !ok {
			continue
		}
		if _, err := net.InterfaceByName(port); err == nil {
			continue
		}
		rules, err := nft.ListRules(ctx, c)
		if err != nil || len(rules) == 0 {
			continue
		}
		tx := nft.NewTransaction()
		tx.Delete(&knftables.Rule{Chain: c, Handle: rules[0].Handle})
		deleteGuard(tx, port)
		g := guardObjects(port)
		tx.Add(g.counter)
		tx.Delete(g.counter)
		nft.Run(ctx, tx) // lost a race with a new port of the name: keep it
	}
	return nil
}

// quoteIfname is an interface name as an nft string literal.
func quoteIfname(name string) string { return `"` + name + `"` }

// guardDrops returns the frames each guarded port of network id dropped,
// by port name.
func guardDrops(ctx context.Context, id string) (map[string]uint64, error) {
	counters, err := namedCounters(ctx, knftables.BridgeFamily, id, guardCounter(""))
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
	alloc *Allocator
	log   *slog.Logger
	nft   knftables.Interface
	inNS  func(func() error) error

	mu        sync.Mutex
	installed map[string][]netip.Addr // by MAC; nil until read from the kernel
	failLog   logLimit
}

func newAddrGuard(n *api.Network, alloc *Allocator, log *slog.Logger, inNS func(func() error) error) (*addrGuard, error) {
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
		tx.Delete(&knftables.Element{Set: guardAddrs, Key: []string{b.mac, b.ip.String()}})
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
func (g *addrGuard) syncAll(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
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
	return g.apply(ctx, add, del)
}

func (g *addrGuard) logFailure(err error) {
	if err == nil {
		return
	}
	if ok, n := g.failLog.allow(g.alloc.now()); ok {
		g.log.Error("guard: the VMs' addresses are not up to date; retrying later", "err", err, "suppressed", n)
	}
}
