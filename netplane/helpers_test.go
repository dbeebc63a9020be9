package netplane

import (
	"slices"
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// testNet is testutil's fixture network.
var testNet = testutil.Network

func TestNFTRules(t *testing.T) {
	n := testNet("s", api.ModeShared, "10.9.0.0/24")
	r := nftRules(n, false)
	if !slices.Contains(r["postrouting"], `ip saddr 10.9.0.0/24 oifname != "vmn-s" masquerade`) || len(r["input"]) != 6 {
		t.Errorf("shared rules: %q", r)
	}
	h := testNet("h", api.ModeHost, "10.9.1.0/24")
	h.DNSProxy = false
	r = nftRules(h, false)
	for _, rule := range r["postrouting"] {
		if strings.Contains(rule, "oifname != ") {
			t.Errorf("host network masquerades what leaves it: %q", rule)
		}
	}
	if len(r["input"]) != 3 || slices.ContainsFunc(r["input"], func(s string) bool { return strings.Contains(s, "dport 53") }) {
		t.Errorf("host network without DNS proxy: input %q", r["input"])
	}
}
