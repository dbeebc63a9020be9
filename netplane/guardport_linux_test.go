package netplane

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/guard"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/nettypes"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// portIndex is the interface index of port in host, as nft writes it.
func portIndex(t *testing.T, host *testutil.NS, port string) string {
	t.Helper()
	return strings.TrimSpace(host.MustRun(t, "cat", "/sys/class/net/"+port+"/ifindex"))
}

// holdMAC makes port of network id's guard hold mac, as if it had learned
// it.
func holdMAC(t *testing.T, host *testutil.NS, id, idx, mac string) {
	t.Helper()
	table := hostnet.TableName(id)
	host.MustRun(t, "nft", "add", "element", "bridge", table, guard.SetHeld, "{", idx, ":", mac, "}")
	host.MustRun(t, "nft", "add", "element", "bridge", table, guard.SetPortMACs, "{", idx, ".", mac, "}")
}

// setHas tells whether set of network id's guard table holds elem (as
// nft writes it).
func setHas(t *testing.T, host *testutil.NS, id, set string, elem ...string) bool {
	t.Helper()
	_, err := host.Run(context.Background(), "nft", append([]string{"get", "element", "bridge", hostnet.TableName(id), set, "{"}, append(elem, "}")...)...)
	return err == nil
}

// TestGuardPortElements: a port is guarded by elements of the network's
// sets, keyed by its interface index: no chain of its own (the table has
// its four, whatever the ports), and guarded twice it is the same; on a
// network with IPv6 and on one without.
func TestGuardPortElements(t *testing.T) {
	needRoot(t)
	for _, n := range []*api.Network{g6Net(), testNet("gc4", api.ModeHost, "10.200.56.0/24")} {
		host := testutil.NewNS(t, "gc-host")
		start(t, host, n, Options{StateDir: t.TempDir(), Upstreams: []string{"127.0.0.1:53"}})
		host.MustRun(t, "ip", "link", "add", "p-a", "type", "veth", "peer", "name", "p-b")
		for range 2 {
			host.MustDo(t, func() error { return guard.AddPort(context.Background(), n, "p-a", nil) })
		}
		if !setHas(t, host, n.ID, guard.SetGuarded, portIndex(t, host, "p-a")) {
			t.Errorf("network %s: p-a is not in %s", n.ID, guard.SetGuarded)
		}
		if setHas(t, host, n.ID, guard.SetGuarded, portIndex(t, host, "p-b")) {
			t.Errorf("network %s: p-b, never guarded, is in %s", n.ID, guard.SetGuarded)
		}
		listing := host.MustRun(t, "nft", "list", "table", "bridge", hostnet.TableName(n.ID))
		if c := strings.Count(listing, "\tchain "); c != 4 {
			t.Errorf("network %s: the guard table has %d chains, want 4:\n%s", n.ID, c, listing)
		}
		var errs []error
		host.MustDo(t, func() error { errs = guard.CheckTable(context.Background(), n); return nil })
		if len(errs) > 0 {
			t.Errorf("network %s: Check of a whole guard table: %v", n.ID, errs)
		}
	}
}

// TestGuardMigratesV2: a guard table of version 2 (a chain, a MAC set and
// a counter per port, reached through a verdict map) fails Check; Ensure
// makes it this version's in one transaction, its port guarded with the
// MAC it held, nothing of version 2 left.
func TestGuardMigratesV2(t *testing.T) {
	needRoot(t)
	host, n, _ := g6Lab(t, "gm")
	table := hostnet.TableName(n.ID)
	mac := "52:55:55:00:0d:01"
	host.MustRun(t, "ip", "link", "add", "p-u", "type", "veth", "peer", "name", "p-v")
	host.MustRun(t, "nft", "delete", "table", "bridge", table)
	host.MustRun(t, "sh", "-c", "nft -f - <<'EOF'\n"+`table bridge `+table+` {
	comment "`+hostnet.Mark(n.ID)+`"
	set mac-p-u { type ether_addr; size 1; flags dynamic; elements = { `+mac+` } }
	set rules-v2 { type ifname; elements = { "p-u" } }
	set tmpl-mac { type ether_addr; size 1; flags dynamic; }
	counter drops-p-u { }
	counter tmpl-drops { }
	chain port-p-u { ether saddr != @mac-p-u counter name "drops-p-u" drop; }
	chain tmpl-port { ether saddr != @tmpl-mac counter name "tmpl-drops" drop; }
	map ports { type ifname : verdict; elements = { "p-u" : jump port-p-u } }
	chain prerouting { type filter hook prerouting priority filter; policy accept; iifname vmap @ports; }
}
EOF`)
	var errs []error
	host.MustDo(t, func() error { errs = guard.CheckTable(context.Background(), n); return nil })
	if len(errs) == 0 {
		t.Fatalf("Check of a version 2 guard table found nothing wrong")
	}
	host.MustDo(t, func() error { return guard.EnsureTable(context.Background(), n) })
	idx := portIndex(t, host, "p-u")
	if !setHas(t, host, n.ID, guard.SetGuarded, idx) || !setHas(t, host, n.ID, guard.SetPortMACs, idx, ".", mac) {
		t.Errorf("after the migration, p-u is not guarded with its MAC:\n%s", host.MustRun(t, "nft", "list", "table", "bridge", table))
	}
	listing := host.MustRun(t, "nft", "list", "table", "bridge", table)
	for _, old := range []string{"port-p-u", "mac-p-u", "drops-p-u", "tmpl-", "rules-v2", "map ports", "vmap"} {
		if strings.Contains(listing, old) {
			t.Errorf("after the migration, %q is left:\n%s", old, listing)
		}
	}
	host.MustDo(t, func() error { errs = guard.CheckTable(context.Background(), n); return nil })
	if len(errs) > 0 {
		t.Errorf("Check after the migration: %v", errs)
	}
}

// TestGuardDeletesIdempotent: a guard batch that deletes what is already
// gone does not fail (issue 31: one missing element failed the whole
// batch, "delete element ... No such file or directory", and the guard
// drifted from what it should hold until the next resync).
func TestGuardDeletesIdempotent(t *testing.T) {
	needRoot(t)
	host, n, nw := g6Lab(t, "gi")
	gone := guard.Binding{MAC: "52:55:55:00:0e:01", IP: ip("10.200.9.77")}
	kept := guard.Binding{MAC: "52:55:55:00:0e:02", IP: ip("10.200.9.78")}
	host.MustDo(t, func() error {
		return nw.guard.Change(context.Background(), []guard.Binding{kept}, []guard.Binding{gone})
	})
	if out := host.MustRun(t, "nft", "list", "set", "bridge", hostnet.TableName(n.ID), guard.SetAddrs); !strings.Contains(out, kept.IP.String()) || strings.Contains(out, gone.IP.String()) {
		t.Errorf("after adding %v and deleting %v, which was not there:\n%s", kept, gone, out)
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

// TestGuardChainsDamaged: a guard table whose checks lost a rule behind
// vmnetctl's back fails Check, and the next port's guard makes the chain
// whole again before it adds the port; a port guarded for a controller
// (AddPortKept: the controller repairs its networks' tables itself) is
// guarded without that look.
func TestGuardChainsDamaged(t *testing.T) {
	needRoot(t)
	host, n, _ := g6Lab(t, "gd")
	table := hostnet.TableName(n.ID)
	// Its first rule (the tagged frames' drop) out.
	var handle string
	for _, l := range strings.Split(host.MustRun(t, "nft", "-a", "list", "chain", "bridge", table, guard.SetChecks), "\n") {
		if _, h, ok := strings.Cut(l, "# handle "); ok && strings.Contains(l, guard.SetL2Types) {
			handle = strings.TrimSpace(h)
		}
	}
	host.MustRun(t, "nft", "delete", "rule", "bridge", table, guard.SetChecks, "handle", handle)
	var errs []error
	host.MustDo(t, func() error { errs = guard.CheckTable(context.Background(), n); return nil })
	if len(errs) == 0 {
		t.Errorf("Check of a guard without its first rule found nothing wrong")
	}
	host.MustRun(t, "ip", "link", "add", "p-k", "type", "veth", "peer", "name", "p-l")
	host.MustDo(t, func() error { return guard.AddPortKept(context.Background(), n, "p-k", nil) })
	if !setHas(t, host, n.ID, guard.SetGuarded, portIndex(t, host, "p-k")) {
		t.Errorf("AddPortKept left its port unguarded")
	}
	if got := host.MustRun(t, "nft", "list", "chain", "bridge", table, guard.SetChecks); strings.Contains(got, "ether type != @"+guard.SetL2Types) {
		t.Errorf("AddPortKept looked at the guard's chains and mended them:\n%s", got)
	}
	host.MustRun(t, "ip", "link", "add", "p-d", "type", "veth", "peer", "name", "p-e")
	host.MustDo(t, func() error { return guard.AddPort(context.Background(), n, "p-d", nil) })
	if got := host.MustRun(t, "nft", "list", "chain", "bridge", table, guard.SetChecks); !strings.Contains(got, "ether type != @"+guard.SetL2Types) {
		t.Errorf("the guard lacks the rule taken out:\n%s", got)
	}
}

// TestGuardReused: a learning port guarded again (its helper restarted, a
// fleet's VM attached again under its name) keeps its guard when it holds
// nothing or the port's own expected MAC: nothing is deleted, so the
// kernel's commit does not wait for its readers. A guard that holds
// another MAC releases it.
func TestGuardReused(t *testing.T) {
	needRoot(t)
	host, n, _ := g6Lab(t, "gr")
	own, other := "52:55:55:00:0f:01", "52:55:55:00:0f:02"
	host.MustRun(t, "ip", "link", "add", "p-r", "type", "veth", "peer", "name", "p-s")
	idx := portIndex(t, host, "p-r")
	host.MustDo(t, func() error {
		return guard.ClaimPorts(context.Background(), n, map[string]net.HardwareAddr{"p-r": mustMAC(own)}, nettypes.ClaimOptions{Reread: true})
	})
	guardPort := func() {
		t.Helper()
		host.MustDo(t, func() error { return guard.AddPort(context.Background(), n, "p-r", nil) })
	}
	held := func() string {
		var h string
		host.MustDo(t, func() (err error) { h, err = guard.ReadHeld(n.ID, "p-r"); return err })
		return h
	}
	guardPort()
	guardPort()
	if !setHas(t, host, n.ID, guard.SetGuarded, idx) || held() != "" {
		t.Fatalf("a port guarded twice: guarded %v, holds %q", setHas(t, host, n.ID, guard.SetGuarded, idx), held())
	}
	holdMAC(t, host, n.ID, idx, own)
	guardPort()
	if h := held(); h != own {
		t.Errorf("the reused guard holds %q, not the port's own MAC %s", h, own)
	}
	host.MustRun(t, "nft", "flush", "map", "bridge", hostnet.TableName(n.ID), guard.SetHeld)
	host.MustRun(t, "nft", "flush", "set", "bridge", hostnet.TableName(n.ID), guard.SetPortMACs)
	holdMAC(t, host, n.ID, idx, other)
	host.MustRun(t, "nft", "add", "element", "bridge", hostnet.TableName(n.ID), guard.SetClaimed, "{", other, "}")
	guardPort()
	if h := held(); h != "" {
		t.Errorf("the port still holds %q, a MAC it does not own", h)
	}
	if setHas(t, host, n.ID, guard.SetPortMACs, idx, ".", other) || setHas(t, host, n.ID, guard.SetClaimed, other) {
		t.Errorf("the MAC the port held is left in port-macs or claimed:\n%s", host.MustRun(t, "nft", "list", "table", "bridge", hostnet.TableName(n.ID)))
	}
}

// TestPruneGuards: the guards of the ports that are gone go in batches,
// each with the MAC it held unless that MAC is some port's expected one;
// a port that is still there keeps its guard.
func TestPruneGuards(t *testing.T) {
	needRoot(t)
	host, n, _ := g6Lab(t, "gp")
	table := hostnet.TableName(n.ID)
	expected := "52:55:55:00:10:0e"
	ports := map[string]string{"p-1": "52:55:55:00:10:01", "p-2": "52:55:55:00:10:02", "p-3": expected, "p-live": "52:55:55:00:10:04"}
	// More than one batch's worth (guard.PruneChunk).
	var gone []string
	for i := range 2 * guard.PruneChunk {
		port := fmt.Sprintf("p-x%d", i)
		ports[port] = fmt.Sprintf("52:55:55:00:11:%02x", i)
		gone = append(gone, port)
	}
	host.MustDo(t, func() error {
		return guard.ClaimPorts(context.Background(), n, map[string]net.HardwareAddr{"vmt-x": mustMAC(expected)}, nettypes.ClaimOptions{Reread: true})
	})
	index := map[string]string{}
	for port, mac := range ports {
		host.MustRun(t, "ip", "link", "add", port, "type", "veth", "peer", "name", port+"-peer")
		host.MustDo(t, func() error { return guard.AddPort(context.Background(), n, port, nil) })
		index[port] = portIndex(t, host, port)
		holdMAC(t, host, n.ID, index[port], mac)
		host.MustRun(t, "nft", "add", "element", "bridge", table, guard.SetClaimed, "{", mac, "}")
	}
	for _, port := range append(gone, "p-1", "p-2", "p-3") {
		host.MustRun(t, "ip", "link", "del", port)
	}
	host.MustDo(t, func() error { return guard.PruneGuards(n.ID) })
	for port, mac := range ports {
		live := port == "p-live"
		if has := setHas(t, host, n.ID, guard.SetGuarded, index[port]); has != live {
			t.Errorf("after the prune, %s in guarded: %v", port, has)
		}
		if has := setHas(t, host, n.ID, guard.SetPortMACs, index[port], ".", mac); has != live {
			t.Errorf("after the prune, %s holds its MAC: %v", port, has)
		}
	}
	claimed := host.MustRun(t, "nft", "list", "set", "bridge", table, guard.SetClaimed)
	for _, c := range []struct {
		mac  string
		want bool
	}{{ports["p-1"], false}, {ports["p-2"], false}, {ports[gone[len(gone)-1]], false}, {expected, true}, {ports["p-live"], true}} {
		if got := strings.Contains(claimed, c.mac); got != c.want {
			t.Errorf("after the prune, %s claimed: %v, want %v\n%s", c.mac, got, c.want, claimed)
		}
	}
}

// TestGuardStrays: a port that the guard lets send from a second MAC (as a
// VMM writing one port's frames from two threads could make it learn)
// fails Check, and Ensure takes the second MAC away, and its claim, the
// one it holds kept.
func TestGuardStrays(t *testing.T) {
	needRoot(t)
	host, n, _ := g6Lab(t, "gs")
	own, second := "52:55:55:00:12:01", "52:55:55:00:12:02"
	host.MustRun(t, "ip", "link", "add", "p-s", "type", "veth", "peer", "name", "p-t")
	host.MustDo(t, func() error { return guard.AddPort(context.Background(), n, "p-s", nil) })
	idx := portIndex(t, host, "p-s")
	holdMAC(t, host, n.ID, idx, own)
	var errs []error
	host.MustDo(t, func() error { errs = guard.CheckTable(context.Background(), n); return nil })
	if len(errs) > 0 {
		t.Fatalf("Check of a port holding one MAC: %v", errs)
	}
	host.MustRun(t, "nft", "add", "element", "bridge", hostnet.TableName(n.ID), guard.SetPortMACs, "{", idx, ".", second, "}")
	host.MustRun(t, "nft", "add", "element", "bridge", hostnet.TableName(n.ID), guard.SetClaimed, "{", second, "}")
	host.MustDo(t, func() error { errs = guard.CheckTable(context.Background(), n); return nil })
	if len(errs) == 0 || !strings.Contains(errs[0].Error(), second) {
		t.Fatalf("Check of a port allowed a second MAC: %v", errs)
	}
	host.MustDo(t, func() error { return guard.EnsureTable(context.Background(), n) })
	if setHas(t, host, n.ID, guard.SetPortMACs, idx, ".", second) || !setHas(t, host, n.ID, guard.SetPortMACs, idx, ".", own) {
		t.Errorf("after Ensure:\n%s", host.MustRun(t, "nft", "list", "set", "bridge", hostnet.TableName(n.ID), guard.SetPortMACs))
	}
	if setHas(t, host, n.ID, guard.SetClaimed, second) {
		t.Errorf("the second MAC is still claimed after Ensure")
	}
}

// TestClaimsMemo: a pass that does not reread changes the claims from what
// the last one wrote, so an element taken behind the controller's back
// stays out until a pass rereads (the full passes), which puts it back.
func TestClaimsMemo(t *testing.T) {
	needRoot(t)
	host, n, _ := g6Lab(t, "gq")
	macA, macB := mustMAC("52:55:55:00:13:0a"), mustMAC("52:55:55:00:13:0b")
	claim := func(reread bool, expected map[string]net.HardwareAddr) {
		t.Helper()
		host.MustDo(t, func() error {
			return guard.ClaimPorts(context.Background(), n, expected, nettypes.ClaimOptions{Reread: reread, PortsGone: true})
		})
	}
	owns := func(mac net.HardwareAddr, port string) bool {
		return setHas(t, host, n.ID, guard.SetOwns, mac.String(), ".", `"`+port+`"`)
	}
	claim(false, map[string]net.HardwareAddr{"p-a": macA})
	host.MustRun(t, "nft", "delete", "element", "bridge", hostnet.TableName(n.ID), guard.SetOwns, "{", macA.String(), ".", `"p-a"`, "}")
	claim(false, map[string]net.HardwareAddr{"p-a": macA, "p-b": macB})
	if owns(macA, "p-a") || !owns(macB, "p-b") {
		t.Fatalf("from the memo: p-a owns %v (taken behind its back: want false), p-b %v (want true)", owns(macA, "p-a"), owns(macB, "p-b"))
	}
	claim(true, map[string]net.HardwareAddr{"p-a": macA, "p-b": macB})
	if !owns(macA, "p-a") || !owns(macB, "p-b") {
		t.Errorf("after a pass that rereads: p-a owns %v, p-b %v, want both", owns(macA, "p-a"), owns(macB, "p-b"))
	}
}

// TestUnguardUnguarded: removing the guard of a port that has none (an
// attachment that opted out, on a network whose guard table was never
// made) changes nothing and succeeds (the bench's VM side failed on it:
// "removing the guards of 1 ports: no such file or directory").
func TestUnguardUnguarded(t *testing.T) {
	needRoot(t)
	host := testutil.NewNS(t, "gz-host")
	host.MustRun(t, "ip", "link", "add", "p-z", "type", "veth", "peer", "name", "p-y")
	n := testNet("gz", api.ModeShared, "10.200.62.0/24")
	host.MustDo(t, func() error { return guard.RemovePort(context.Background(), n, "p-z") })
	host.MustDo(t, func() error { return guard.RemovePort(context.Background(), n, "p-gone") })
}
