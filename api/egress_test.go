package api

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

// TestEgress reads a network's egress policy and resolves it to ranges:
// the longest matching prefix decides, a deny beats an allow of the same
// prefix, aliases stand for what they say, and mistakes are errors.
func TestEgress(t *testing.T) {
	n := mustNetworks(t, `vmnet:
  sandbox:
    subnet: 10.1.0.0/24
    egress:
      default: deny
      allow: [internet, 10.9.0.0/16, 192.0.2.7]
      deny: [lan, 10.9.8.0/24, host]
`).Get("sandbox")
	e := n.Egress
	if e == nil || e.DefaultAllow || e.HostAllowed() || len(e.Rules) != 6 {
		t.Fatalf("egress %+v", e)
	}
	lan := []netip.Prefix{netip.MustParsePrefix("192.168.1.0/24"), netip.MustParsePrefix("fd99::/64")}
	got := map[string]bool{}
	for _, r := range e.Ranges(true, lan) {
		got[fmt.Sprintf("%s-%s", r.First, r.Last)] = r.Allow
	}
	allowed := func(a string) bool {
		ip := netip.MustParseAddr(a)
		for _, r := range e.Ranges(ip.Is4(), lan) {
			if !ip.Less(r.First) && !r.Last.Less(ip) {
				return r.Allow
			}
		}
		t.Fatalf("%s in no range: %v", a, got)
		return false
	}
	for _, c := range []struct {
		addr  string
		allow bool
	}{
		{"8.8.8.8", true},      // internet
		{"192.168.1.9", false}, // lan, more specific than internet
		{"10.9.1.1", true},     // 10.9.0.0/16
		{"10.9.8.8", false},    // 10.9.8.0/24 inside it
		{"192.0.2.7", true},    // one address
		{"2001:db8::1", true},  // internet, IPv6
		{"fd99::5", false},     // lan, IPv6
	} {
		if allowed(c.addr) != c.allow {
			t.Errorf("%s: allow %v, want %v (ranges %v)", c.addr, !c.allow, c.allow, got)
		}
	}
	// Deny beats allow of one prefix; the default with no rule.
	e2 := &Egress{DefaultAllow: true, Rules: []EgressRule{{Allow: true, Prefix: netip.MustParsePrefix("10.0.0.0/8")}, {Allow: false, Prefix: netip.MustParsePrefix("10.0.0.0/8")}}}
	for _, r := range e2.Ranges(true, nil) {
		if r.First == netip.MustParseAddr("10.0.0.0") && r.Allow {
			t.Errorf("deny and allow of 10.0.0.0/8: allowed")
		}
	}

	// Names: exact or every name under one; a deny beats an allow.
	ne := mustNetworks(t, "vmnet:\n  s:\n    subnet: 10.1.0.0/24\n    egress:\n      allow: [pypi.org, \"*.github.com\"]\n      deny: [evil.github.com]\n").Get("s").Egress
	for _, c := range []struct {
		name      string
		allow, ok bool
	}{
		{"pypi.org.", true, true}, {"PyPI.org", true, true}, {"files.pypi.org", false, false},
		{"api.github.com", true, true}, {"github.com", false, false}, {"evil.github.com.", false, true},
	} {
		if allow, ok := ne.NameVerdict(strings.Split(strings.TrimSuffix(c.name, "."), ".")); allow != c.allow || ok != c.ok {
			t.Errorf("NameVerdict(%s) = %v, %v; want %v, %v", c.name, allow, ok, c.allow, c.ok)
		}
	}
	// Labels, not text: the query for `evil\.github.com` has the labels
	// "evil.github" and "com", under com alone.
	if allow, ok := ne.NameVerdict([]string{"evil.github", "com"}); ok {
		t.Errorf("NameVerdict of the labels evil.github, com = %v, true; want no verdict (it is no name under github.com)", allow)
	}

	for _, c := range []struct{ name, src, want string }{
		{"a name without the DNS proxy", "dnsProxy: false\n    egress: {allow: [pypi.org]}", "pypi.org is a name: the network's DNS proxy learns names' addresses"},
		{"bad default", "egress: {default: maybe}", `must be allow or deny, not "maybe"`},
		{"bad prefix", "egress: {deny: [10.0.0/8]}", `"10.0.0/8" is not a prefix`},
		{"host bits", "egress: {deny: [10.0.0.1/8]}", "has host bits set; the prefix is 10.0.0.0/8"},
		{"twice", "egress: {allow: [10.0.0.0/8], deny: [10.0.0.0/8]}", "10.0.0.0/8 is also listed at line"},
		{"unknown key", "egress: {block: [10.0.0.0/8]}", "block"},
	} {
		_, diags := LoadNetworks("n.yaml", []byte("vmnet:\n  s:\n    subnet: 10.1.0.0/24\n    "+c.src+"\n"))
		if err := diags.Err(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
}

// TestEgressNone: `egress: none` is a network's or a VM's policy that
// allows nothing (`{default: deny}`); another word is an error that
// suggests it.
func TestEgressNone(t *testing.T) {
	nets, diags := LoadNetworks("n.yaml", []byte("vmnet:\n  sandbox:\n    mode: shared\n    subnet: 10.70.0.0/24\n    egress: none\n"))
	if err := diags.Err(); err != nil {
		t.Fatal(err)
	}
	e := nets.Get("sandbox").Egress
	if e == nil || e.DefaultAllow || len(e.Rules) != 0 {
		t.Errorf("egress: none gave %+v", e)
	}
	vf, vdiags := LoadVMFile("v.yaml", []byte("vms:\n  agent:\n    networks:\n      - vmnet: shared\n        egress: none\n"), VMFileOptions{})
	if err := vdiags.Err(); err != nil {
		t.Fatal(err)
	}
	if a := vf.VMs[0].Attachments[0]; a.Egress == nil || a.Egress.DefaultAllow {
		t.Errorf("a VM's egress: none gave %+v", a.Egress)
	}
	_, diags = LoadNetworks("n.yaml", []byte("vmnet:\n  sandbox:\n    mode: shared\n    subnet: 10.70.0.0/24\n    egress: nnone\n"))
	if err := diags.Err(); err == nil || !strings.Contains(err.Error(), "n.yaml:5") || !strings.Contains(err.Error(), "none") {
		t.Errorf("egress: nnone: %v", err)
	}
}

// TestEgressECH: `ech: outer` reads, shows in the policy's text (so that
// plan sees a change), and `ech: refuse` is the default; another word is
// refused with its line, and the closest suggested.
func TestEgressECH(t *testing.T) {
	load := func(ech string) (*Egress, error) {
		vf, diags := LoadVMFile("v.yaml", []byte("vms:\n  agent:\n    networks:\n      - vmnet: shared\n        egress:\n          default: deny\n          allow: [pypi.org]\n"+ech), VMFileOptions{})
		if err := diags.Err(); err != nil {
			return nil, err
		}
		return vf.VMs[0].Attachments[0].Egress, nil
	}
	for _, c := range []struct {
		ech  string
		want bool
	}{{"", false}, {"          ech: refuse\n", false}, {"          ech: outer\n", true}} {
		e, err := load(c.ech)
		if err != nil || e.ECHOuter != c.want {
			t.Errorf("%q: %+v, %v", c.ech, e, err)
		}
		if got := strings.HasSuffix(e.String(), ", ech outer"); got != c.want {
			t.Errorf("%q: String %q", c.ech, e.String())
		}
	}
	if _, err := load("          ech: outr\n"); err == nil || !strings.Contains(err.Error(), `v.yaml:8: vms.agent.networks[0].egress.ech: must be refuse`) || !strings.Contains(err.Error(), `did you mean "outer"?`) {
		t.Errorf("ech: outr: %v", err)
	}
}
