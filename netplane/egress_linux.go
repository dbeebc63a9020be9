package netplane

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

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
