package api

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// Egress is a network's policy for connections its VMs open: a default and
// allow and deny lists of prefixes and aliases; the longest prefix that
// matches a destination decides.
type Egress struct {
	// DefaultAllow is `default: allow` (the default) or deny.
	DefaultAllow bool         `json:"defaultAllow"`
	Rules        []EgressRule `json:"rules"`
	// ECHOuter is `ech: outer`: the name check judges a ClientHello that
	// carries an encrypted one (ECH) by its outer name rather than refuse
	// it (`ech: refuse`, the default). Browsers send a decoy ECH (GREASE)
	// when they have no ECH configuration, which a name policy's DNS
	// answers never give them; a guest that brings a configuration of its
	// own can reach any name served behind an allowed one's front.
	ECHOuter bool `json:"echOuter,omitempty"`
}

// EgressRule allows or denies a destination: a prefix or an alias.
type EgressRule struct {
	Allow  bool         `json:"allow"`
	Prefix netip.Prefix `json:"prefix,omitzero"`
	// Alias is "host" (the host's own addresses), "lan" (the subnets of
	// the host's own interfaces) or "internet" (0.0.0.0/0 and ::/0).
	Alias string `json:"alias,omitempty"`
	// Name is a DNS name ("pypi.org") or every name under one
	// ("*.github.com"), lower case: the addresses the network's DNS proxy
	// answers for it, for as long as the answer lives.
	Name string `json:"name,omitempty"`
	Line int    `json:"line"`
}

// EgressNone is `egress: none`: nothing allowed (`{default: deny}`).
const EgressNone = "none"

// Egress aliases.
const (
	EgressHost     = "host"
	EgressLAN      = "lan"
	EgressInternet = "internet"
)

var egressKeys = []string{"default", "allow", "deny", "ech"}

// The values of a policy's `ech`.
const (
	EgressECHRefuse = "refuse"
	EgressECHOuter  = "outer"
)

// MaxEgressRules bounds a policy: each rule is a few kernel map elements.
const MaxEgressRules = 1024

// egress reads a network's `egress` section.
func (w *walker) egress(n *Network, v *yaml.Node, path string) {
	n.Egress = w.egressPolicy(v, path, func(item *yaml.Node, p, s string) bool {
		if !n.DNSProxy {
			w.errorf(item, p, "%s is a name: the network's DNS proxy learns names' addresses, and this network has none (dnsProxy: false)", s)
			return false
		}
		return true
	})
}

// egressPolicy reads an `egress` section (a network's or a VM entry's);
// nameOK says whether a name may be listed there (and reports why not).
// nil when the section has errors.
func (w *walker) egressPolicy(v *yaml.Node, path string, nameOK func(item *yaml.Node, p, s string) bool) *Egress {
	if n := deref(v); n.Kind == yaml.ScalarNode && n.Tag != "!!null" {
		// `egress: none`: no way out at all, the one word a sandbox
		// needs (`{default: deny}`): DHCP and DNS on the gateway still
		// answer.
		if n.Value == EgressNone {
			return &Egress{DefaultAllow: false}
		}
		w.errorf(n, path, "must be %s or a map of default, allow, deny and ech, not %q%s", EgressNone, n.Value, suggest(n.Value, []string{EgressNone}))
		return nil
	}
	f, _, ok := w.collect(deref(v), path, egressKeys)
	if !ok {
		return nil
	}
	at := func(k string) string { return joinPath(path, k) }
	e := &Egress{DefaultAllow: true}
	if dv, ok := f["default"]; ok {
		if s, ok := w.str(dv, at("default")); ok {
			switch s {
			case "allow", "deny":
				e.DefaultAllow = s == "allow"
			default:
				w.errorf(dv, at("default"), "must be allow or deny, not %q", s)
			}
		}
	}
	if ev, ok := f["ech"]; ok {
		if s, ok := w.str(ev, at("ech")); ok {
			switch s {
			case EgressECHRefuse, EgressECHOuter:
				e.ECHOuter = s == EgressECHOuter
			default:
				w.errorf(ev, at("ech"), "must be %s (an encrypted ClientHello is refused, the default) or %s (judged by its outer name: browsers' decoy ECH passes), not %q%s", EgressECHRefuse, EgressECHOuter, s, suggest(s, []string{EgressECHRefuse, EgressECHOuter}))
			}
		}
	}
	seen := map[string]int{}
	for _, list := range []struct {
		key   string
		allow bool
	}{{"allow", true}, {"deny", false}} {
		lv, ok := f[list.key]
		if !ok {
			continue
		}
		lv = deref(lv)
		if lv.Kind != yaml.SequenceNode {
			w.errorf(lv, at(list.key), "must be a list of prefixes (10.0.0.0/8) or aliases (host, lan, internet), not %s", kindName(lv))
			continue
		}
		for i, item := range lv.Content {
			p := fmt.Sprintf("%s[%d]", at(list.key), i)
			s, ok := w.str(item, p)
			if !ok {
				continue
			}
			r := EgressRule{Allow: list.allow, Line: item.Line}
			switch {
			case s == EgressHost, s == EgressLAN, s == EgressInternet:
				r.Alias = s
			case isEgressName(s):
				r.Name = strings.ToLower(strings.TrimSuffix(s, "."))
				if !nameOK(item, p, s) {
					continue
				}
			default:
				pf, err := netip.ParsePrefix(s)
				if err != nil {
					if a, aerr := netip.ParseAddr(s); aerr == nil {
						pf, err = netip.PrefixFrom(a, a.BitLen()), nil
					}
				}
				if err != nil {
					w.errorf(item, p, "%q is not a prefix (10.0.0.0/8, fd00::/8), an address, a name (pypi.org, *.github.com) or an alias (host, lan, internet)", s)
					continue
				}
				if pf.Addr().Is4In6() {
					w.errorf(item, p, "%s is an IPv4 address written as IPv6, which IPv4 traffic never matches: write %s", s, netip.PrefixFrom(pf.Addr().Unmap(), max(pf.Bits()-96, 0)))
					continue
				}
				if pf.Masked() != pf {
					w.errorf(item, p, "%s has host bits set; the prefix is %s", s, pf.Masked())
					continue
				}
				r.Prefix = pf
			}
			key := r.Alias + r.Name + r.Prefix.String()
			if prev, dup := seen[key]; dup {
				w.errorf(item, p, "%s is also listed at line %d", s, prev)
				continue
			}
			seen[key] = item.Line
			e.Rules = append(e.Rules, r)
		}
	}
	if len(e.Rules) > MaxEgressRules {
		w.errorf(v, path, "has %d rules; at most %d", len(e.Rules), MaxEgressRules)
		return nil
	}
	return e
}

// String is the policy as `plan` shows it: "" without one.
func (e *Egress) String() string {
	if e == nil {
		return ""
	}
	def := "deny"
	if e.DefaultAllow {
		def = "allow"
	}
	var allow, deny []string
	for _, r := range e.Rules {
		s := r.Alias + r.Name
		if s == "" {
			s = r.Prefix.String()
		}
		if r.Allow {
			allow = append(allow, s)
		} else {
			deny = append(deny, s)
		}
	}
	s := fmt.Sprintf("default %s, allow [%s], deny [%s]", def, strings.Join(allow, " "), strings.Join(deny, " "))
	if e.ECHOuter {
		s += ", ech outer"
	}
	return s
}

// isEgressName reports whether s is a DNS name with a dot (example.com,
// *.example.com), not a prefix or an address.
func isEgressName(s string) bool {
	s = strings.TrimPrefix(strings.TrimSuffix(s, "."), "*.")
	if !strings.Contains(s, ".") || len(s) > 253 || strings.Contains(s, "/") {
		return false
	}
	if _, err := netip.ParseAddr(s); err == nil {
		return false
	}
	labels := strings.Split(s, ".")
	if strings.Trim(labels[len(labels)-1], "0123456789") == "" {
		return false // 192.168.1, 010.0.0.1: a mistyped address, not a name
	}
	for _, label := range labels {
		if label == "" || len(label) > 63 {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// NameVerdict says what the policy says of a DNS name, given as its
// labels from the first to the last (the root's empty label left out), as
// the query carried them: allowed, denied, or neither (ok false). A deny
// beats an allow; "*.x" covers the names under x, not x. Names are
// compared label by label, never as text: a label that holds a dot (the
// one label "evil.wild" of the query for `evil\.wild.test`) is no label of
// a listed name, so it matches no "*.wild.test".
func (e *Egress) NameVerdict(labels []string) (allow, ok bool) {
	for _, r := range e.Rules {
		if r.Name == "" {
			continue
		}
		suffix, wild := strings.CutPrefix(r.Name, "*.")
		want := strings.Split(suffix, ".")
		match := len(labels) == len(want)
		if wild {
			match = len(labels) > len(want)
		}
		for i := 1; match && i <= len(want); i++ {
			match = strings.EqualFold(labels[len(labels)-i], want[len(want)-i])
		}
		if match {
			if !r.Allow {
				return false, true
			}
			allow, ok = true, true
		}
	}
	return allow, ok
}

// HasNames reports whether the policy lists names.
func (e *Egress) HasNames() bool {
	return slices.ContainsFunc(e.Rules, func(r EgressRule) bool { return r.Name != "" })
}

// HostAllowed reports whether the policy lets VMs open connections to the
// host's own addresses (beyond DHCP and DNS, always allowed).
func (e *Egress) HostAllowed() bool {
	for _, r := range e.Rules {
		if r.Alias == EgressHost {
			return r.Allow
		}
	}
	return e.DefaultAllow
}

// EgressRange is a range of addresses and what the policy says of it.
type EgressRange struct {
	First, Last netip.Addr
	Allow       bool
}

// Ranges resolves the policy for one family (IPv4 when v4, else IPv6),
// "lan" standing for lan: the ranges that cover the whole address space,
// in order, each decided by the longest matching prefix (a deny beats an
// allow of the same prefix), the default where none matches.
func (e *Egress) Ranges(v4 bool, lan []netip.Prefix) []EgressRange {
	all := netip.MustParsePrefix("::/0")
	if v4 {
		all = netip.MustParsePrefix("0.0.0.0/0")
	}
	type painted struct {
		p     netip.Prefix
		allow bool
	}
	var ps []painted
	for _, r := range e.Rules {
		switch {
		case r.Alias == EgressInternet:
			ps = append(ps, painted{all, r.Allow})
		case r.Alias == EgressLAN:
			for _, l := range lan {
				if l.Addr().Is4() == v4 {
					ps = append(ps, painted{l.Masked(), r.Allow})
				}
			}
		case r.Prefix.IsValid() && r.Prefix.Addr().Is4() == v4:
			ps = append(ps, painted{r.Prefix, r.Allow})
		}
	}
	// Less specific first, so that more specific ones paint over them;
	// of one prefix, the deny last.
	slices.SortStableFunc(ps, func(a, b painted) int {
		if c := cmp.Compare(a.p.Bits(), b.p.Bits()); c != 0 {
			return c
		}
		if a.allow != b.allow {
			if a.allow {
				return -1
			}
			return 1
		}
		return 0
	})
	rs := []EgressRange{{all.Addr(), lastOf(all), e.DefaultAllow}}
	for _, p := range ps {
		rs = paint(rs, p.p.Addr(), lastOf(p.p), p.allow)
	}
	// Neighbours that say the same become one.
	out := rs[:1]
	for _, r := range rs[1:] {
		if last := &out[len(out)-1]; last.Allow == r.Allow {
			last.Last = r.Last
			continue
		}
		out = append(out, r)
	}
	return out
}

// paint sets first..last to allow in rs (ordered, covering the space).
func paint(rs []EgressRange, first, last netip.Addr, allow bool) []EgressRange {
	var out []EgressRange
	for _, r := range rs {
		if r.Last.Less(first) || last.Less(r.First) {
			out = append(out, r)
			continue
		}
		if r.First.Less(first) {
			out = append(out, EgressRange{r.First, first.Prev(), r.Allow})
		}
		out = append(out, EgressRange{maxAddr(r.First, first), minAddr(r.Last, last), allow})
		if last.Less(r.Last) {
			out = append(out, EgressRange{last.Next(), r.Last, r.Allow})
		}
	}
	return out
}

func lastOf(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

func maxAddr(a, b netip.Addr) netip.Addr {
	if a.Less(b) {
		return b
	}
	return a
}

func minAddr(a, b netip.Addr) netip.Addr {
	if a.Less(b) {
		return a
	}
	return b
}
