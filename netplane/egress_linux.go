package netplane

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"
)

// The egress policy (api.Egress) in the kernel: the network's forward
// chain looks each new connection's destination up in an interval map of
// verdicts per family, filled from the policy's ranges (longest prefix
// first, resolved by api.Egress.Ranges); "lan" is what the host's own
// interfaces reach directly, read again every egressRefresh.

// egressRefresh is how often the host's LANs are read again.
const egressRefresh = 30 * time.Second

// addEgressObjects adds the egress maps, counter and chain to tx.
func addEgressObjects(tx *knftables.Transaction) {
	tx.Add(&knftables.Counter{Name: EgressDenied})
	tx.Add(&knftables.Chain{Name: EgressDenied})
	tx.Flush(&knftables.Chain{Name: EgressDenied})
	tx.Add(&knftables.Rule{Chain: EgressDenied, Rule: fmt.Sprintf("counter name %q drop", EgressDenied)})
	for _, s := range []struct{ name, typ string }{
		{EgressNames4, "ipv4_addr"}, {EgressNamesDenied4, "ipv4_addr"}, {EgressNames6, "ipv6_addr"}, {EgressNamesDenied6, "ipv6_addr"},
	} {
		tx.Add(&knftables.Set{Name: s.name, Type: s.typ, Flags: []knftables.SetFlag{knftables.TimeoutFlag}})
	}
	tx.Add(&knftables.Map{Name: Egress4, Type: "ipv4_addr : verdict", Flags: []knftables.SetFlag{knftables.IntervalFlag}})
	tx.Add(&knftables.Map{Name: Egress6, Type: "ipv6_addr : verdict", Flags: []knftables.SetFlag{knftables.IntervalFlag}})
}

// applyEgress fills the maps from the policy and the host's LANs now,
// unless that would change nothing.
func (nw *Network) applyEgress(ctx context.Context) error {
	e := nw.n.Egress
	if e == nil || nw.inNS == nil {
		return nil
	}
	var lan []netip.Prefix
	if err := nw.inNS(func() (err error) { lan, err = hostLANs(); return err }); err != nil {
		return fmt.Errorf("network %q: the host's LANs for the egress policy: %w", nw.n.ID, err)
	}
	nft, err := newNFT(knftables.InetFamily, nw.n.ID)
	if err != nil {
		return err
	}
	tx := nft.NewTransaction()
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
	if sig.String() == nw.egressApplied {
		return nil
	}
	if err := nw.inNS(func() error { return nft.Run(ctx, tx) }); err != nil {
		return fmt.Errorf("network %q: the egress policy: %w", nw.n.ID, err)
	}
	nw.egressApplied = sig.String()
	return nil
}

// hostLANs are the prefixes the host's own interfaces reach directly
// (their link-scope routes in the main table), not vmnetctl's bridges.
func hostLANs() ([]netip.Prefix, error) {
	links, err := linkList()
	if err != nil {
		return nil, err
	}
	ours := map[int]bool{}
	for _, l := range links {
		if _, ok := markedID(l.Attrs().Alias); ok || strings.HasPrefix(l.Attrs().Alias, aliasPrefix) {
			ours[l.Attrs().Index] = true
		}
	}
	var out []netip.Prefix
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := retryDump(func() ([]netlink.Route, error) {
			return netlink.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		})
		if err != nil {
			return nil, err
		}
		for _, r := range routes {
			if r.Dst == nil || r.Scope != netlink.SCOPE_LINK || ours[r.LinkIndex] {
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
	return c[""]
}

// Names' addresses stay allowed (or denied) for their answer's TTL, but
// at least egressNameMin (a client may use an answer a little longer than
// it lives) and at most egressNameMax.
const (
	egressNameMin = time.Minute
	egressNameMax = 24 * time.Hour
)

// learnNames is the DNS proxy's hook for the answers it forwards: the
// addresses of a name the policy allows or denies go into the names' sets
// before the VM hears the answer, so its connection right after finds
// them. Bounded: only listed names' answers, at most what one answer
// holds.
func (nw *Network) learnNames(qname string, answers []dns.RR) {
	e := nw.n.Egress
	if e == nil || !e.HasNames() {
		return
	}
	allow, ok := e.NameVerdict(qname)
	if !ok {
		return
	}
	set4, set6 := EgressNames4, EgressNames6
	if !allow {
		set4, set6 = EgressNamesDenied4, EgressNamesDenied6
	}
	nft, err := newNFT(knftables.InetFamily, nw.n.ID)
	if err != nil {
		return
	}
	tx := nft.NewTransaction()
	n := 0
	for _, rr := range answers {
		ttl := min(max(time.Duration(rr.Header().Ttl)*time.Second, egressNameMin), egressNameMax)
		var set, ip string
		switch a := rr.(type) {
		case *dns.A:
			set, ip = set4, a.A.String()
		case *dns.AAAA:
			set, ip = set6, a.AAAA.String()
		default:
			continue
		}
		// Delete, then add: an address answered again lives on from now.
		tx.Add(&knftables.Element{Set: set, Key: []string{ip + " timeout 1s"}})
		tx.Delete(&knftables.Element{Set: set, Key: []string{ip}})
		tx.Add(&knftables.Element{Set: set, Key: []string{fmt.Sprintf("%s timeout %ds", ip, int(ttl.Seconds()))}})
		n++
	}
	if n == 0 {
		return
	}
	if err := nw.inNS(func() error { return nft.Run(context.Background(), tx) }); err != nil {
		nw.log.Warn("egress: the addresses of a name are not in force", "name", qname, "err", err)
	}
}
