package netplane

import (
	"context"
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/test/testutil"
	"sigs.k8s.io/knftables"
)

// TestGuardClone: a learning port's guard copied from the template through
// netlink lists exactly as nft makes it from portRules, on a network with
// IPv6 and on one without; and it is made again (a second GuardPort) the
// same.
func TestGuardClone(t *testing.T) {
	needRoot(t)
	for _, n := range []*api.Network{g6Net(), testNet("gc4", api.ModeHost, "10.200.56.0/24")} {
		host := testutil.NewNS(t, "gc-host")
		start(t, host, n, Options{StateDir: t.TempDir(), Upstreams: []string{"127.0.0.1:53"}})
		host.MustRun(t, "ip", "link", "add", "p-a", "type", "veth", "peer", "name", "p-b")
		// The template GuardPort copies is there (else it used nft).
		host.MustRun(t, "nft", "list", "chain", "bridge", TableName(n.ID), guardTemplate)
		for range 2 {
			mustDo(t, host, func() error { return GuardPort(context.Background(), n, "p-a", nil) })
		}
		got := host.MustRun(t, "nft", "list", "chain", "bridge", TableName(n.ID), guardChain("p-a"))
		// What nft makes of portRules, in a chain of its own.
		mustDo(t, host, func() error {
			return runGuardTx(context.Background(), n, "test", func(tx *knftables.Transaction) {
				g := guardObjects("p-b")
				tx.Add(g.set)
				tx.Add(g.counter)
				tx.Add(g.chain)
				for _, r := range portRules(n, "p-b", true) {
					tx.Add(&knftables.Rule{Chain: g.chain.Name, Rule: r})
				}
			})
		})
		want := host.MustRun(t, "nft", "list", "chain", "bridge", TableName(n.ID), guardChain("p-b"))
		if strings.ReplaceAll(want, "p-b", "p-a") != got {
			t.Errorf("network %s: the copied guard:\n%s\nnft's:\n%s", n.ID, got, want)
		}
		if !strings.Contains(host.MustRun(t, "nft", "list", "map", "bridge", TableName(n.ID), guardPorts), `"p-a" : jump port-p-a`) {
			t.Errorf("network %s: p-a is not in the ports map", n.ID)
		}
	}
}
