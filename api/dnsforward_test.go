package api

import (
	"strings"
	"testing"
)

func ptr[T any](v T) *T { return &v }

// TestDNSForward: dnsForward defaults to true on shared networks and false
// on host-only ones, an explicit value wins, a bad value is an error, and
// bridged networks (no proxy) show it unset.
func TestDNSForward(t *testing.T) {
	nets := mustNetworks(t, `
vmnet:
  sh: {mode: shared, subnet: 10.1.0.0/24}
  shOff: {mode: shared, subnet: 10.2.0.0/24, dnsForward: false}
  ho: {mode: host, subnet: 10.3.0.0/24}
  hoOn: {mode: host, subnet: 10.4.0.0/24, dnsForward: true}
  br: {mode: bridged, interface: eth0}
`)
	for _, tt := range []struct {
		id   string
		want *bool
	}{{"sh", ptr(true)}, {"shOff", ptr(false)}, {"ho", ptr(false)}, {"hoOn", ptr(true)}, {"br", nil}} {
		n := nets.Get(tt.id)
		switch {
		case (n.DNSForward == nil) != (tt.want == nil):
			t.Errorf("%s: dnsForward = %v, want %v", tt.id, n.DNSForward, tt.want)
		case tt.want != nil && *n.DNSForward != *tt.want:
			t.Errorf("%s: dnsForward = %v, want %v", tt.id, *n.DNSForward, *tt.want)
		case tt.want != nil && n.ForwardsDNS() != *tt.want:
			t.Errorf("%s: ForwardsDNS() = %v, want %v", tt.id, n.ForwardsDNS(), *tt.want)
		}
	}
	// A network built by hand (nil) takes its mode's default.
	if !(&Network{Mode: ModeShared}).ForwardsDNS() || (&Network{Mode: ModeHost}).ForwardsDNS() {
		t.Errorf("ForwardsDNS of an unset dnsForward: want the mode's default")
	}

	_, diags := LoadNetworks("networks.yaml", []byte("vmnet:\n  h:\n    mode: host\n    subnet: 10.3.0.0/24\n    dnsForward: yes please\n"))
	checkDiags(t, diags, SeverityError, []want{{5, "vmnet.h.dnsForward", "must be true or false"}})

	for _, tt := range []struct{ name, src string }{
		{"without the proxy", "vmnet:\n  h:\n    mode: host\n    subnet: 10.3.0.0/24\n    dnsProxy: false\n    dnsForward: true\n"},
		{"on a bridged network", "networks:\n  br:\n    mode: bridged\n    interface: eth0\n    dhcp: false\n    dnsForward: true\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			nets, diags := LoadNetworks("networks.yaml", []byte(tt.src))
			if nets == nil {
				t.Fatalf("unexpected errors:\n%s", diagText(diags))
			}
			found := false
			for _, d := range diags.filter(SeverityWarning) {
				found = found || d.Line == 6 && strings.HasSuffix(d.Field, ".dnsForward")
			}
			if !found {
				t.Errorf("no warning on dnsForward:\n%s", diagText(diags))
			}
		})
	}
}
