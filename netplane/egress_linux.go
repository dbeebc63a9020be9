package netplane

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/nettypes"
)

// The egress policy (api.Egress) in the kernel: the network's forward
// chain looks each new connection's destination up in an interval map of
// verdicts per family, filled from the policy's ranges (longest prefix
// first, resolved by api.Egress.Ranges); "lan" is what the host's own
// interfaces reach directly, read again every egressRefresh.

// The sets that count the refused connections per source address.
const (
	egressBy4     = "egress-denied-by4"
	egressBy6     = "egress-denied-by6"
	egressSources = 4096
)

// egressDeniedBy returns the connections the policy refused, by source
// address, from the per-source sets (read through netlink, with their
// counters).
func egressDeniedBy(id string) (map[netip.Addr]uint64, error) {
	out := map[netip.Addr]uint64{}
	for _, set := range []string{egressBy4, egressBy6} {
		elems, err := hostnet.SetElements(nftables.TableFamilyINet, id, set)
		if err != nil {
			return out, fmt.Errorf("network %q: reading the set %s: %w", id, set, err)
		}
		for _, e := range elems {
			ip, ok := netip.AddrFromSlice(e.Key)
			if ok && e.Counter != nil {
				out[ip] += e.Counter.Packets
			}
		}
	}
	return out, nil
}

// egressRefresh is how often the host's LANs are read again.
const egressRefresh = 30 * time.Second

// addEgressDenied adds to tx the chain that counts and drops what the
// policies refuse, with its rules: ensureTable's, once per table.
func addEgressDenied(tx *knftables.Transaction, id string) {
	addEgressObjects(tx)
	tx.Flush(&knftables.Chain{Name: EgressDenied})
	tx.Add(&knftables.Rule{Chain: EgressDenied, Rule: "update @" + egressBy4 + " { ip saddr counter }"})
	tx.Add(&knftables.Rule{Chain: EgressDenied, Rule: "update @" + egressBy6 + " { ip6 saddr counter }"})
	for _, r := range egressLogRules(id) {
		tx.Add(&knftables.Rule{Chain: EgressDenied, Rule: r})
	}
	tx.Add(&knftables.Rule{Chain: EgressDenied, Rule: fmt.Sprintf("counter name %q drop", EgressDenied)})
}

// addEgressObjects adds the egress policies' objects to tx, if missing:
// the refusals' counter and chain, the maps and sets.
func addEgressObjects(tx *knftables.Transaction) {
	tx.Add(&knftables.Counter{Name: EgressDenied})
	tx.Add(&knftables.Chain{Name: EgressDenied})
	// Counted per source too, for each VM's count: a dynamic set with a
	// counter per element (at most egressSources; past it, the network's
	// count alone).
	tx.Add(&knftables.Set{Name: egressBy4, Type: "ipv4_addr", Flags: []knftables.SetFlag{knftables.DynamicFlag}, Size: knftables.PtrTo(uint64(egressSources))})
	tx.Add(&knftables.Set{Name: egressBy6, Type: "ipv6_addr", Flags: []knftables.SetFlag{knftables.DynamicFlag}, Size: knftables.PtrTo(uint64(egressSources))})
	// The sources' rates of denied flows copied to NFLOG (egresslog_linux.go).
	// In a fixed order: the table is made again on every Ensure, and
	// its listing must not change (TestShared's EnsureTwice).
	for _, set := range [][2]string{{egressLog4, "ipv4_addr"}, {egressLog6, "ipv6_addr"}} {
		tx.Add(&knftables.Set{Name: set[0], Type: set[1], Flags: []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag},
			Timeout: knftables.PtrTo(time.Minute), Size: knftables.PtrTo(uint64(egressSources))})
	}
	for _, s := range []struct{ name, typ string }{
		{EgressNames4, "ipv4_addr"}, {EgressNamesDenied4, "ipv4_addr"}, {EgressNames6, "ipv6_addr"}, {EgressNamesDenied6, "ipv6_addr"},
	} {
		tx.Add(&knftables.Set{Name: s.name, Type: s.typ, Flags: []knftables.SetFlag{knftables.TimeoutFlag}, Size: knftables.PtrTo(uint64(maxLearned))})
	}
	tx.Add(&knftables.Map{Name: Egress4, Type: "ipv4_addr : verdict", Flags: []knftables.SetFlag{knftables.IntervalFlag}})
	tx.Add(&knftables.Map{Name: Egress6, Type: "ipv6_addr : verdict", Flags: []knftables.SetFlag{knftables.IntervalFlag}})
	for _, s := range []struct{ name, typ string }{
		{egressVMNames4, "ipv4_addr . ipv4_addr"}, {egressVMNoNames4, "ipv4_addr . ipv4_addr"},
		{egressVMNames6, "ipv6_addr . ipv6_addr"}, {egressVMNoNames6, "ipv6_addr . ipv6_addr"},
	} {
		tx.Add(&knftables.Set{Name: s.name, Type: s.typ, Flags: []knftables.SetFlag{knftables.TimeoutFlag}, Size: knftables.PtrTo(uint64(maxLearned))})
	}
	tx.Add(&knftables.Map{Name: egressProxy4, Type: "inet_service : inet_service"})
	tx.Add(&knftables.Map{Name: egressProxy6, Type: "inet_service : inet_service"})
	tx.Add(&knftables.Set{Name: egressProxyPorts, Type: "inet_service"})
	tx.Add(&knftables.Set{Name: egressOwn4, Type: "ipv4_addr"})
	tx.Add(&knftables.Set{Name: egressOwn6, Type: "ipv6_addr"})
	tx.Add(&knftables.Set{Name: egressNoHost4, Type: "ipv4_addr"})
	tx.Add(&knftables.Set{Name: egressNoHost6, Type: "ipv6_addr"})
	tx.Add(&knftables.Map{Name: egressVM4, Type: "ipv4_addr . ipv4_addr : verdict", Flags: []knftables.SetFlag{knftables.IntervalFlag}})
	tx.Add(&knftables.Map{Name: egressVM6, Type: "ipv6_addr . ipv6_addr : verdict", Flags: []knftables.SetFlag{knftables.IntervalFlag}})
}

// applyEgress fills the maps from the policy and the host's LANs now,
// unless that would change nothing.
func (nw *Network) applyEgress(ctx context.Context) error {
	e := nw.n.Egress
	if e == nil || nw.nsr == nil {
		return nil
	}
	var lan []netip.Prefix
	if err := nw.nsr.do(func() (err error) { lan, err = hostLANs(); return err }); err != nil {
		return fmt.Errorf("network %q: the host's LANs for the egress policy: %w", nw.n.ID, err)
	}
	nw.nameCheck.lan.Store(&lan)
	nft, err := hostnet.NFT(knftables.InetFamily, nw.n.ID)
	if err != nil {
		return err
	}
	tx := nft.NewTransaction()
	sig := fillEgress(tx, e, lan)
	if sig == nw.egressApplied {
		return nil
	}
	if err := nw.nsr.do(func() error { return nft.Run(ctx, tx) }); err != nil {
		return fmt.Errorf("network %q: the egress policy: %w", nw.n.ID, err)
	}
	nw.egressApplied = sig
	return nil
}

// fillEgress adds to tx the egress objects and the maps' elements for e,
// and returns what it wrote, to compare with the next time. ensureTable
// writes them in the transaction that makes the table, so the policy is
// never absent while it stands.
func fillEgress(tx *knftables.Transaction, e *api.Egress, lan []netip.Prefix) string {
	addEgressObjects(tx)
	var sig strings.Builder
	for _, fam := range []struct {
		m  string
		v4 bool
	}{{Egress4, true}, {Egress6, false}} {
		tx.Flush(&knftables.Map{Name: fam.m})
		for _, r := range e.Ranges(fam.v4, lan) {
			verdict := "continue"
			if !r.Allow {
				verdict = "goto " + EgressDenied
			}
			fmt.Fprintf(&sig, "%s-%s:%s;", r.First, r.Last, verdict)
			tx.Add(&knftables.Element{Map: fam.m, Key: []string{r.First.String() + "-" + r.Last.String()}, Value: []string{verdict}})
		}
	}
	return sig.String()
}

// hostLANs are the prefixes the host's own interfaces reach directly (the
// main table's routes without a gateway), not vmnetctl's bridges: LANs,
// and also container bridges and VPN links.
func hostLANs() ([]netip.Prefix, error) {
	// Whether a route's link is ours, asked of the few links that have
	// routes, not of every link (a thousand VMs' TAPs have none).
	ours := map[int]bool{}
	isOurs := func(index int) bool {
		if v, ok := ours[index]; ok {
			return v
		}
		l, err := netlink.LinkByIndex(index)
		if err == nil {
			_, marked := hostnet.MarkedID(l.Attrs().Alias)
			ours[index] = marked || strings.HasPrefix(l.Attrs().Alias, hostnet.AliasPrefix)
		}
		return ours[index]
	}
	var out []netip.Prefix
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := hostnet.RetryDump(func() ([]netlink.Route, error) {
			return netlink.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		})
		if err != nil {
			return nil, err
		}
		for _, r := range routes {
			// On the link: no gateway (IPv6 routes all have universe scope).
			if r.Dst == nil || r.Gw != nil || len(r.MultiPath) > 0 || r.Type != unix.RTN_UNICAST || isOurs(r.LinkIndex) {
				continue
			}
			a, ok := netip.AddrFromSlice(r.Dst.IP)
			if !ok {
				continue
			}
			ones, _ := r.Dst.Mask.Size()
			p := netip.PrefixFrom(a.Unmap(), ones).Masked()
			if p.Addr().IsLinkLocalUnicast() || p.Addr().IsMulticast() {
				continue
			}
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int { return strings.Compare(a.String(), b.String()) })
	return slices.Compact(out), nil
}

// egressDenied is the connections the network's policy refused.
func egressDenied(ctx context.Context, id string) uint64 {
	c, _ := namedCounters(ctx, knftables.InetFamily, id, EgressDenied)
	return c[EgressDenied]
}

// Names' addresses stay allowed (or denied) for their answer's TTL, but
// at least egressNameMin (a client may use an answer a little longer than
// it lives) and at most egressNameMax.
const (
	egressNameMin = time.Minute
	egressNameMax = 24 * time.Hour
)

// nameCache remembers until when each learned address (by set) is in
// force, so that an answer seen again costs nothing unless it extends the
// address's life by much, and one nftables handle serves them all.
type nameCache struct {
	mu  sync.Mutex
	nft knftables.Interface
	exp map[string]time.Time // "set/ip" → when its element expires
	// by is the client whose answer put each element there, and per how
	// many each client holds: no client may hold more than
	// maxLearnedPerClient of them.
	by  map[string]netip.Addr
	per map[netip.Addr]int
}

// forget drops the remembered expiries of the sets whose names start
// with prefix (they were emptied).
func (c *nameCache) forget(prefix string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.exp {
		if strings.HasPrefix(k, prefix) {
			c.drop(k)
		}
	}
}

// drop forgets element k. Call with c.mu held.
func (c *nameCache) drop(k string) {
	delete(c.exp, k)
	if client, ok := c.by[k]; ok {
		delete(c.by, k)
		if c.per[client]--; c.per[client] <= 0 {
			delete(c.per, client)
		}
	}
}

// pruneExpired forgets the elements that expired by now. Call with c.mu
// held.
func (c *nameCache) pruneExpired(now time.Time) {
	for k, e := range c.exp {
		if !now.Before(e) {
			c.drop(k)
		}
	}
}

// maxLearned bounds the names' addresses a network keeps (the sets' size
// too): past it, new ones are not learned until some expire.
const maxLearned = 16384

// maxLearnedPerClient bounds what one client's answers may add of them: a
// VM that asks for a listed wildcard's ever new names (every address of a
// cloud's hosts) cannot fill the sets for the others.
const maxLearnedPerClient = maxLearned / 8

// learnNames is the DNS proxy's hook for the answers it forwards to
// client: the addresses of a name a policy lists (the A and AAAA records
// on the chain of CNAMEs from the name asked) go into the names' sets
// before the client hears the answer, so its connection right after finds
// them: the network's sets for the network's policy, and (source,
// address) pairs for the client VM's own policy, if it has one. An address
// already in force for at least half the answer's TTL costs nothing;
// others cost one nft transaction per answer.
func (nw *Network) learnNames(client netip.Addr, qname string, answers []dns.RR) {
	if nw.onEgressDenied != nil {
		nw.recent.add(client, qname, answers)
	}
	targets := nw.nameTargets(client, qname)
	if len(targets) == 0 {
		return
	}
	chain := cnameChain(qname, answers)
	c := &nw.names
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.nft == nil {
		nft, err := hostnet.NFT(knftables.InetFamily, nw.n.ID)
		if err != nil {
			return
		}
		c.nft, c.exp, c.by, c.per = nft, map[string]time.Time{}, map[string]netip.Addr{}, map[netip.Addr]int{}
	}
	l := nameLearning{c: c, client: client, now: time.Now(), tx: c.nft.NewTransaction(), changed: map[string]time.Time{}}
	for _, rr := range answers {
		ip := answerAddr(rr)
		if !chain[strings.ToLower(rr.Header().Name)] || !ip.IsValid() || !learnable(ip) {
			continue
		}
		ttl := min(max(time.Duration(rr.Header().Ttl)*time.Second, egressNameMin), egressNameMax)
		for _, t := range targets {
			set := t.set6
			if ip.Is4() {
				set = t.set4
			}
			for _, key := range t.keys(ip) {
				l.learn(set, key, ttl)
			}
		}
	}
	if len(l.changed) == 0 {
		return
	}
	if err := nw.nsr.do(func() error { return c.nft.Run(context.Background(), l.tx) }); err != nil {
		nw.log.Warn("egress: the addresses of a name are not in force", "name", qname, "err", err)
		return
	}
	for k, until := range l.changed {
		if _, known := c.exp[k]; !known {
			c.by[k] = client
			c.per[client]++
		}
		c.exp[k] = until
	}
}

// nameTarget is a pair of sets an answer's addresses go into: the
// network's (srcs nil) or a VM's own, whose elements are (source,
// address) pairs for each of its sources.
type nameTarget struct {
	set4, set6 string
	srcs       []netip.Addr
}

// keys are the elements of t for address ip.
func (t nameTarget) keys(ip netip.Addr) [][]string {
	if t.srcs == nil {
		return [][]string{{ip.String()}}
	}
	var keys [][]string
	for _, src := range t.srcs {
		if src.Is4() == ip.Is4() {
			keys = append(keys, []string{src.String(), ip.String()})
		}
	}
	return keys
}

// nameTargets are the sets the addresses of qname go into for client: the
// network's policy's, then the client VM's own policy's, each the allowed
// or the denied names' as the policy judges qname; none if no policy
// lists it.
func (nw *Network) nameTargets(client netip.Addr, qname string) []nameTarget {
	var targets []nameTarget
	// The name as the labels the query carried: a label that holds a dot
	// (evil\.wild.test) is one label, under test alone, not a name under
	// wild.test.
	labels := dns.SplitDomainName(qname)
	if e := nw.n.Egress; e != nil && e.HasNames() {
		if allow, ok := e.NameVerdict(labels); ok {
			t := nameTarget{set4: EgressNames4, set6: EgressNames6}
			if !allow {
				t = nameTarget{set4: EgressNamesDenied4, set6: EgressNamesDenied6}
			}
			targets = append(targets, t)
		}
	}
	if e, srcs := nw.ownPolicy(client); e != nil && e.HasNames() {
		if allow, ok := e.NameVerdict(labels); ok {
			t := nameTarget{set4: egressVMNames4, set6: egressVMNames6, srcs: srcs}
			if !allow {
				t = nameTarget{set4: egressVMNoNames4, set6: egressVMNoNames6, srcs: srcs}
			}
			targets = append(targets, t)
		}
	}
	return targets
}

// learnable reports whether an answer's address may be learned for a
// name: not one no connection goes out to (loopback, unspecified,
// link-local, multicast, IPv4 written as IPv6), which whoever writes an
// allowed name's records could otherwise point the VMs at.
func learnable(ip netip.Addr) bool {
	return !ip.IsLoopback() && !ip.IsUnspecified() && !ip.IsLinkLocalUnicast() && !ip.IsMulticast() && !ip.Is4In6()
}

// cnameChain is the names an answer to qname holds the addresses of:
// qname and the CNAMEs from it, in lower case.
func cnameChain(qname string, answers []dns.RR) map[string]bool {
	chain := map[string]bool{strings.ToLower(qname): true}
	for range answers { // CNAMEs may come in any order
		for _, rr := range answers {
			if c, ok := rr.(*dns.CNAME); ok && chain[strings.ToLower(c.Hdr.Name)] {
				chain[strings.ToLower(c.Target)] = true
			}
		}
	}
	return chain
}

// answerAddr is the address of an A or AAAA record; not valid for others.
func answerAddr(rr dns.RR) netip.Addr {
	var ip netip.Addr
	switch a := rr.(type) {
	case *dns.A:
		ip, _ = netip.AddrFromSlice(a.A.To4())
	case *dns.AAAA:
		ip, _ = netip.AddrFromSlice(a.AAAA.To16())
	}
	return ip
}

// nameLearning is one answer's learning: the cache (held), the client
// asking, the transaction it builds and the elements it changes.
type nameLearning struct {
	c       *nameCache
	client  netip.Addr
	now     time.Time
	tx      *knftables.Transaction
	changed map[string]time.Time
	fresh   int // new elements in this answer
}

// learn puts element key of set, for ttl, into the transaction: unless
// it is in force for at least half of ttl already, or it is new and the
// client or everyone holds as many as they may.
func (l *nameLearning) learn(set string, key []string, ttl time.Duration) {
	c := l.c
	ck := set + "/" + strings.Join(key, "/")
	cur, known := c.exp[ck]
	if known && l.now.Before(cur) && !cur.Before(l.now.Add(ttl/2)) {
		return // in force long enough
	}
	full := func() bool { return len(c.exp) >= maxLearned || c.per[l.client]+l.fresh >= maxLearnedPerClient }
	if !known && full() {
		c.pruneExpired(l.now)
		if full() {
			return
		}
	}
	if !known {
		l.fresh++
	}
	until := l.now.Add(ttl)
	if cur.After(until) {
		until = cur
	}
	// Deleted (whether it is there or not), added with the new timeout:
	// it lives on until then, never shorter.
	deleteLearned(l.tx, set, key)
	l.tx.Add(&knftables.Element{Set: set, Key: keyWithTimeout(key, fmt.Sprintf("%ds", int(until.Sub(l.now).Seconds())+1))})
	l.changed[ck] = until
}

// ownPolicy is the policy of the VM that sends from src, if it has one of
// its own, and all that VM's sources.
func (nw *Network) ownPolicy(src netip.Addr) (*api.Egress, []netip.Addr) {
	nw.vmEgress.mu.Lock()
	defer nw.vmEgress.mu.Unlock()
	i, ok := nw.vmEgress.bySource[src.Unmap()]
	if !ok {
		return nil, nil
	}
	return nw.vmEgress.policies[i].Egress, nw.vmEgress.sources[i]
}

// vmEgressState is the VMs' own policies, kept to apply again when their
// addresses change.
type vmEgressState struct {
	mu       sync.Mutex
	policies []nettypes.VMEgress
	applied  string
	// appliedPolicies is what the policies were (and the host's LANs) when
	// last applied, as JSON.
	appliedPolicies string
	// bySource gives the policy (its index) of a source address;
	// sources, each policy's VM's addresses: as last applied.
	bySource map[netip.Addr]int
	sources  [][]netip.Addr
}

// SetVMEgress gives the VMs in ps their own egress policy, in place of
// the network's, at the addresses they have now (and again whenever those
// change): one transaction, skipped when nothing changed.
func (nw *Network) SetVMEgress(ctx context.Context, ps []nettypes.VMEgress) error {
	if !nw.n.Routed() || nw.nsr == nil {
		return nil
	}
	nw.vmEgress.mu.Lock()
	defer nw.vmEgress.mu.Unlock()
	if len(ps) == 0 && len(nw.vmEgress.policies) == 0 && nw.vmEgress.applied == "" && nw.vmEgress.appliedPolicies != "" {
		// None, as when they were last written (the maps flushed): the
		// controller's every pass, which need not read the host's LANs.
		return nil
	}
	nw.vmEgress.policies = slices.Clone(ps)
	return nw.applyVMEgress(ctx)
}

// refreshVMEgress applies the VMs' policies again (an address changed).
func (nw *Network) refreshVMEgress() {
	nw.vmEgress.mu.Lock()
	defer nw.vmEgress.mu.Unlock()
	if len(nw.vmEgress.policies) == 0 && nw.vmEgress.applied == "" {
		return
	}
	if err := nw.applyVMEgress(context.Background()); err != nil {
		nw.log.Error("the VMs' egress policies are not up to date", "err", err)
	}
}

func (nw *Network) applyVMEgress(ctx context.Context) error {
	var lan []netip.Prefix
	if err := nw.nsr.do(func() (err error) { lan, err = hostLANs(); return err }); err != nil {
		return err
	}
	nw.nameCheck.lan.Store(&lan)
	nft, err := hostnet.NFT(knftables.InetFamily, nw.n.ID)
	if err != nil {
		return err
	}
	tx := nft.NewTransaction()
	addEgressObjects(tx)
	for _, o := range vmPolicySets {
		tx.Flush(&knftables.Set{Name: o})
	}
	for _, o := range vmPolicyMaps {
		tx.Flush(&knftables.Map{Name: o})
	}
	var sig strings.Builder
	bySource := map[netip.Addr]int{}
	sources := make([][]netip.Addr, len(nw.vmEgress.policies))
	for pi, p := range nw.vmEgress.policies {
		var srcs []netip.Addr
		if ip, ok := nw.vmAddr(p.MAC); ok {
			srcs = append(srcs, ip)
		}
		if nw.guard6 != nil {
			if hw, err := net.ParseMAC(p.MAC); err == nil {
				srcs = append(srcs, nw.guard6.Learner.Lookup(hw)...)
			}
		}
		sources[pi] = srcs
		for _, src := range srcs {
			bySource[src] = pi
			v4 := src.Is4()
			own, nohost, m := egressOwn6, egressNoHost6, egressVM6
			if v4 {
				own, nohost, m = egressOwn4, egressNoHost4, egressVM4
			}
			tx.Add(&knftables.Element{Set: own, Key: []string{src.String()}})
			// (Whose source it is, too: an address that passes from one
			// VM to another with the same rules changes hands all the
			// same.)
			fmt.Fprintf(&sig, "%s %s host %v;", src, p.MAC, p.Egress.HostAllowed())
			if !p.Egress.HostAllowed() {
				tx.Add(&knftables.Element{Set: nohost, Key: []string{src.String()}})
			}
			for _, r := range p.Egress.Ranges(v4, lan) {
				verdict := "continue"
				if !r.Allow {
					verdict = "goto " + EgressDenied
				}
				fmt.Fprintf(&sig, "%s %s-%s:%s;", src, r.First, r.Last, verdict)
				tx.Add(&knftables.Element{Map: m, Key: []string{src.String(), r.First.String() + "-" + r.Last.String()}, Value: []string{verdict}})
			}
		}
	}
	// The policies whole (their names too, which the maps do not show),
	// but what the name check reads per connection (`ech`): a change of
	// it alone forgets no learned name.
	judged := make([]nettypes.VMEgress, len(nw.vmEgress.policies))
	for i, p := range nw.vmEgress.policies {
		judged[i] = p
		if p.Egress != nil && p.Egress.ECHOuter {
			e := *p.Egress
			e.ECHOuter = false
			judged[i].Egress = &e
		}
	}
	policies, err := json.Marshal(struct {
		P   []nettypes.VMEgress
		LAN []netip.Prefix
	}{judged, lan})
	if err != nil {
		return err
	}
	if sig.String() == nw.vmEgress.applied && string(policies) == nw.vmEgress.appliedPolicies {
		return nil
	}
	// The names the VMs' policies learned, as (source, address) pairs, go
	// where their source changed hands (an address may now be another
	// VM's, or nobody's), all of them when the policies changed (a name
	// no longer allowed must not stay so): learned again from the VMs'
	// next queries. One VM's lease coming and going costs the others
	// nothing.
	var stale map[netip.Addr]bool
	if string(policies) == nw.vmEgress.appliedPolicies {
		stale = map[netip.Addr]bool{}
		for src, i := range nw.vmEgress.bySource {
			if j, ok := bySource[src]; !ok || j != i {
				stale[src] = true
			}
		}
	}
	forgotten := nw.names.forgetSources(tx, stale)
	if err := nw.nsr.do(func() error { return nft.Run(ctx, tx) }); err != nil {
		return fmt.Errorf("network %q: the VMs' egress policies: %w", nw.n.ID, err)
	}
	nw.vmEgress.applied, nw.vmEgress.appliedPolicies = sig.String(), string(policies)
	nw.vmEgress.bySource, nw.vmEgress.sources = bySource, sources
	forgotten()
	return nil
}

// deleteLearned adds to tx the removal of element key of a learned-names
// set (which has timeouts): added first, a no-op if it is there, so that
// the delete finds it even if it expired or was never added.
func deleteLearned(tx *knftables.Transaction, set string, key []string) {
	tx.Add(&knftables.Element{Set: set, Key: keyWithTimeout(key, "1s")})
	tx.Delete(&knftables.Element{Set: set, Key: key})
}

// keyWithTimeout is key with a timeout of d on its element.
func keyWithTimeout(key []string, d string) []string {
	k := slices.Clone(key)
	k[len(k)-1] += " timeout " + d
	return k
}

// The VMs' own policies in the kernel: their sources and those denied the
// host (sets), and their verdicts by source and destination (maps).
var (
	vmPolicySets = []string{egressOwn4, egressOwn6, egressNoHost4, egressNoHost6}
	vmPolicyMaps = []string{egressVM4, egressVM6}
)

// vmNameSets are the sets of (source, address) pairs the VMs' own policies
// learn from DNS answers.
var vmNameSets = []string{egressVMNames4, egressVMNames6, egressVMNoNames4, egressVMNoNames6}

// forgetSources adds to tx the removal of the VMs' learned names of the
// sources in stale, or, when stale is nil, of all of them; the function it
// returns drops them from the cache once tx ran.
func (c *nameCache) forgetSources(tx *knftables.Transaction, stale map[netip.Addr]bool) func() {
	if stale == nil {
		for _, set := range vmNameSets {
			tx.Flush(&knftables.Set{Name: set})
		}
		return func() { c.forget("egress-vm") }
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var gone []string
	for ck := range c.exp {
		// "set/source/address"
		parts := strings.Split(ck, "/")
		if len(parts) != 3 || !slices.Contains(vmNameSets, parts[0]) {
			continue
		}
		src, err := netip.ParseAddr(parts[1])
		if err != nil || !stale[src] {
			continue
		}
		deleteLearned(tx, parts[0], parts[1:])
		gone = append(gone, ck)
	}
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, ck := range gone {
			c.drop(ck)
		}
	}
}
