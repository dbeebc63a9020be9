package netplane

import (
	"context"
	"fmt"
	"net"
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

// TestGuardRulesUpgrade: a running VM's port that an older vmnetctl
// guarded (older rules: here, without the first rule that drops tagged
// frames, and not in the current version's set) is guarded again with
// the current rules by the controller's pass (EnsurePorts), so that a fix
// to the rules reaches the VMs that run through an upgrade.
func TestGuardRulesUpgrade(t *testing.T) {
	needRoot(t)
	host, n, _ := g6Lab(t, "gu")
	mac := "52:55:55:00:0d:01"
	g6VM(t, host, n, "u", mac)
	table := TableName(n.ID)
	// The guard as an older vmnetctl left it.
	host.MustRun(t, "nft", "flush", "chain", "bridge", table, guardChain("p-u"))
	for _, r := range portRules(n, "p-u", false)[1:] {
		host.MustRun(t, "sh", "-c", "nft add rule bridge "+table+" "+guardChain("p-u")+" '"+strings.ReplaceAll(r, "'", `'\''`)+"'")
	}
	host.MustRun(t, "nft", "delete", "element", "bridge", table, guardCurrent, "{", `"p-u"`, "}")
	first := func() string {
		out := host.MustRun(t, "nft", "list", "chain", "bridge", table, guardChain("p-u"))
		for _, l := range strings.Split(out, "\n") {
			if l = strings.TrimSpace(l); strings.HasPrefix(l, "ether ") || strings.HasPrefix(l, "arp ") {
				return l
			}
		}
		return ""
	}
	if strings.Contains(first(), guardL2Types) {
		t.Fatalf("the older guard has the tag rule: %s", first()) // the control
	}
	mustDo(t, host, func() error {
		return EnsurePorts(context.Background(), n, []PortSpec{{Name: "p-u", MAC: mustMAC(mac)}})
	})
	if got := first(); !strings.Contains(got, "ether type != @"+guardL2Types) {
		t.Errorf("after the pass, the port's first rule is %q, want the current rules' (tagged frames dropped first)", got)
	}
	if out := host.MustRun(t, "nft", "list", "set", "bridge", table, guardCurrent); !strings.Contains(out, `"p-u"`) {
		t.Errorf("after the pass, p-u is not in %s:\n%s", guardCurrent, out)
	}
}

// TestGuardDeletesIdempotent: a guard batch that deletes what is already
// gone does not fail (issue 31: one missing element failed the whole
// batch, "delete element ... No such file or directory", and the guard
// drifted from what it should hold until the next resync).
func TestGuardDeletesIdempotent(t *testing.T) {
	needRoot(t)
	host, n, nw := g6Lab(t, "gi")
	gone := binding{mac: "52:55:55:00:0e:01", ip: ip("10.200.9.77")}
	kept := binding{mac: "52:55:55:00:0e:02", ip: ip("10.200.9.78")}
	mustDo(t, host, func() error {
		g := nw.guard
		g.mu.Lock()
		defer g.mu.Unlock()
		if err := g.load(context.Background()); err != nil {
			return err
		}
		return g.apply(context.Background(), []binding{kept}, []binding{gone})
	})
	if out := host.MustRun(t, "nft", "list", "set", "bridge", TableName(n.ID), guardAddrs); !strings.Contains(out, kept.ip.String()) || strings.Contains(out, gone.ip.String()) {
		t.Errorf("after adding %v and deleting %v, which was not there:\n%s", kept, gone, out)
	}
}

// TestGuardCloneDamagedTemplate: a template with a rule taken out behind
// vmnetctl's back is not copied: the port gets every rule, from nft.
func TestGuardCloneDamagedTemplate(t *testing.T) {
	needRoot(t)
	host, n, _ := g6Lab(t, "gd")
	table := TableName(n.ID)
	// Its first rule (the tagged frames' drop) out.
	var handle string
	for _, l := range strings.Split(host.MustRun(t, "nft", "-a", "list", "chain", "bridge", table, guardTemplate), "\n") {
		if _, h, ok := strings.Cut(l, "# handle "); ok && strings.Contains(l, guardL2Types) {
			handle = strings.TrimSpace(h)
		}
	}
	host.MustRun(t, "nft", "delete", "rule", "bridge", table, guardTemplate, "handle", handle)
	host.MustRun(t, "ip", "link", "add", "p-d", "type", "veth", "peer", "name", "p-e")
	mustDo(t, host, func() error { return GuardPort(context.Background(), n, "p-d", nil) })
	got := host.MustRun(t, "nft", "list", "chain", "bridge", table, guardChain("p-d"))
	if !strings.Contains(got, "ether type != @"+guardL2Types) {
		t.Errorf("the port's guard lacks the rule taken out of the template:\n%s", got)
	}
}

// g6Lab is a host namespace running network id, an IPv6 network as
// g6Net's, for the guard's tests.
func g6Lab(t *testing.T, id string) (*testutil.NS, *api.Network, *Network) {
	t.Helper()
	host := testutil.NewNS(t, id+"-host")
	n := g6Net()
	n.ID, n.Name = id, id
	nw := start(t, host, n, Options{StateDir: t.TempDir(), Upstreams: []string{"127.0.0.1:53"}})
	return host, n, nw
}

// TestGuardReused: a learning port guarded again (its helper restarted, a
// fleet's VM attached again under its name) keeps its guard when the guard
// is whole, current and holds nothing or the port's own expected MAC:
// nothing is deleted, so the kernel's commit does not wait for its
// readers. A guard that holds another MAC is replaced, the MAC with it.
func TestGuardReused(t *testing.T) {
	needRoot(t)
	host, n, _ := g6Lab(t, "gr")
	table := TableName(n.ID)
	own, other := "52:55:55:00:0f:01", "52:55:55:00:0f:02"
	host.MustRun(t, "ip", "link", "add", "p-r", "type", "veth", "peer", "name", "p-s")
	mustDo(t, host, func() error {
		return ClaimPorts(context.Background(), n, map[string]net.HardwareAddr{"p-r": mustMAC(own)})
	})
	guard := func() string {
		mustDo(t, host, func() error { return GuardPort(context.Background(), n, "p-r", nil) })
		out := host.MustRun(t, "nft", "-a", "list", "chain", "bridge", table, guardChain("p-r"))
		_, h, _ := strings.Cut(out, "# handle ")
		h, _, _ = strings.Cut(h, "\n")
		return h
	}
	held := func() string { return host.MustRun(t, "nft", "list", "set", "bridge", table, guardMACSet("p-r")) }
	first := guard()
	if again := guard(); again != first {
		t.Errorf("a guard holding nothing was made again (chain handle %s, was %s)", again, first)
	}
	host.MustRun(t, "nft", "add", "element", "bridge", table, guardMACSet("p-r"), "{", own, "}")
	if again := guard(); again != first {
		t.Errorf("a guard holding the port's own MAC was made again (chain handle %s, was %s)", again, first)
	}
	if !strings.Contains(held(), own) {
		t.Errorf("the reused guard forgot the port's own MAC:\n%s", held())
	}
	// Not current (an older vmnetctl's): made again.
	host.MustRun(t, "nft", "delete", "element", "bridge", table, guardCurrent, "{", `"p-r"`, "}")
	replaced := guard()
	if replaced == first {
		t.Errorf("a guard an older version made was kept (chain handle %s)", replaced)
	}
	host.MustRun(t, "nft", "flush", "set", "bridge", table, guardMACSet("p-r"))
	host.MustRun(t, "nft", "add", "element", "bridge", table, guardMACSet("p-r"), "{", other, "}")
	if again := guard(); again == replaced {
		t.Errorf("a guard holding another MAC was kept (chain handle %s)", again)
	}
	if out := held(); strings.Contains(out, other) {
		t.Errorf("the port still holds a MAC it does not own:\n%s", out)
	}
}

// TestPruneGuards: the guards of the ports that are gone go in batches,
// each with the MAC it held unless that MAC is some port's expected one;
// a port that is still there keeps its guard.
func TestPruneGuards(t *testing.T) {
	needRoot(t)
	host, n, _ := g6Lab(t, "gp")
	table := TableName(n.ID)
	expected := "52:55:55:00:10:0e"
	ports := map[string]string{"p-1": "52:55:55:00:10:01", "p-2": "52:55:55:00:10:02", "p-3": expected, "p-live": "52:55:55:00:10:04"}
	// More than one batch's worth (pruneChunk).
	var gone []string
	for i := range 2 * pruneChunk {
		port := fmt.Sprintf("p-x%d", i)
		ports[port] = fmt.Sprintf("52:55:55:00:11:%02x", i)
		gone = append(gone, port)
	}
	mustDo(t, host, func() error {
		return ClaimPorts(context.Background(), n, map[string]net.HardwareAddr{"vmt-x": mustMAC(expected)})
	})
	for port, mac := range ports {
		host.MustRun(t, "ip", "link", "add", port, "type", "veth", "peer", "name", port+"-peer")
		mustDo(t, host, func() error { return GuardPort(context.Background(), n, port, nil) })
		host.MustRun(t, "nft", "add", "element", "bridge", table, guardMACSet(port), "{", mac, "}")
		host.MustRun(t, "nft", "add", "element", "bridge", table, guardClaimed, "{", mac, "}")
	}
	for _, port := range append(gone, "p-1", "p-2", "p-3") {
		host.MustRun(t, "ip", "link", "del", port)
	}
	mustDo(t, host, func() error { return pruneGuards(n.ID) })
	listing := host.MustRun(t, "nft", "list", "table", "bridge", table)
	for port := range ports {
		if has := strings.Contains(listing, "chain "+guardChain(port)+" {"); has != (port == "p-live") {
			t.Errorf("after the prune, the guard of %s is there: %v", port, has)
		}
	}
	claimed := host.MustRun(t, "nft", "list", "set", "bridge", table, guardClaimed)
	for _, c := range []struct {
		mac  string
		want bool
	}{{ports["p-1"], false}, {ports["p-2"], false}, {ports[gone[len(gone)-1]], false}, {expected, true}, {ports["p-live"], true}} {
		if got := strings.Contains(claimed, c.mac); got != c.want {
			t.Errorf("after the prune, %s claimed: %v, want %v\n%s", c.mac, got, c.want, claimed)
		}
	}
}
