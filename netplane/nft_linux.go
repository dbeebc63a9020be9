package netplane

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/hostnet"
)

type chainSpec struct {
	name     string
	typ      knftables.BaseChainType
	hook     knftables.BaseChainHook
	priority knftables.BaseChainPriority
}

var chains = []chainSpec{
	{"input", knftables.FilterType, knftables.InputHook, knftables.FilterPriority},
	{"forward", knftables.FilterType, knftables.ForwardHook, knftables.FilterPriority},
	{"postrouting", knftables.NATType, knftables.PostroutingHook, knftables.SNATPriority},
	{"prerouting", knftables.NATType, knftables.PreroutingHook, knftables.DNATPriority},
	{"early", knftables.FilterType, knftables.PreroutingHook, knftables.RawPriority},
	{"output", knftables.NATType, knftables.OutputHook, knftables.DNATPriority},
}

// Each network has a table of its name in two families: inet for its
// forwarding and NAT (ensureTable), bridge for its ports' guards
// (guard_linux.go). Both carry the network's mark.
var tableFamilies = []knftables.Family{knftables.InetFamily, knftables.BridgeFamily}

// ensureTable replaces network n's table with its rules in one transaction:
// the table is created if needed, deleted with whatever it held, and built
// again, so the result never depends on what was there.
func ensureTable(ctx context.Context, n *api.Network) error {
	if err := checkTableOwner(ctx, n.ID); err != nil {
		return err
	}
	nft, err := hostnet.NFT(knftables.InetFamily, n.ID)
	if err != nil {
		return err
	}
	gate := nameGates(n)
	rules := nftRules(n, gate)
	comment := hostnet.Mark(n.ID)
	var kept []*knftables.Element
	if n.Routed() {
		kept = vmEgressElements(ctx, nft)
	}
	tx := nft.NewTransaction()
	tx.Add(&knftables.Table{Comment: &comment})
	tx.Delete(&knftables.Table{})
	tx.Add(&knftables.Table{Comment: &comment})
	if n.Routed() {
		addForwardObjects(tx)
		addNeighObjects(tx)
	}
	if n.Routed() {
		addEgressDenied(tx, n.ID)
		// The VMs' own policies, as they were, in the same transaction:
		// the network's Start (a controller restart, a repair) must not
		// leave a VM under its network's policy until the controller
		// gives the VMs' policies again (SetVMEgress, later in its pass).
		for _, e := range kept {
			tx.Add(e)
		}
	}
	if n.Egress != nil {
		lan, err := hostLANs()
		if err != nil {
			return fmt.Errorf("network %q: the host's LANs for the egress policy: %w", n.ID, err)
		}
		fillEgress(tx, n.Egress, lan)
	}
	if gate {
		// Regular chains, before the forward chain that jumps to them;
		// the queue's chain empty (its rule comes with the gate's reader:
		// startGate).
		tx.Add(&knftables.Chain{Name: NameQueueChain})
		tx.Add(&knftables.Chain{Name: NameGateChain})
		for _, r := range rules[NameGateChain] {
			tx.Add(&knftables.Rule{Chain: NameGateChain, Rule: r})
		}
	}
	for _, c := range chains {
		rs, ok := rules[c.name]
		if !ok {
			continue
		}
		tx.Add(&knftables.Chain{Name: c.name, Type: knftables.PtrTo(c.typ), Hook: knftables.PtrTo(c.hook),
			Priority: knftables.PtrTo(c.priority), Policy: knftables.PtrTo(knftables.AcceptPolicy)})
		for _, r := range rs {
			tx.Add(&knftables.Rule{Chain: c.name, Rule: r})
		}
	}
	if err := nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("network %q: installing nftables table inet %s: %w", n.ID, hostnet.TableName(n.ID), err)
	}
	if num, ok := boundQueues.Load(queueKeyOf(n.ID)); ok && gate {
		// The network's gate runs: its queue rule, as it was.
		if err := writeQueueRule(n.ID, kernelQueue(), num.(uint16)); err != nil {
			return fmt.Errorf("network %q: the name check's queue rule: %w", n.ID, err)
		}
	}
	return nil
}

// vmEgressElements reads what the VMs' own policies hold in the kernel:
// their sources, those denied the host, and their maps (not the names they
// learned, which have timeouts and are learned again); and the name
// check's ports, which its running proxy set. Nothing when the
// table is missing or unreadable.
func vmEgressElements(ctx context.Context, nft knftables.Interface) []*knftables.Element {
	var out []*knftables.Element
	list := func(kind string, names []string) {
		for _, name := range names {
			elems, err := nft.ListElements(ctx, kind, name)
			if err != nil {
				continue
			}
			for _, e := range elems {
				out = append(out, &knftables.Element{Set: e.Set, Map: e.Map, Key: e.Key, Value: e.Value})
			}
		}
	}
	list("set", slices.Concat(vmPolicySets, []string{egressProxyPorts}))
	list("map", slices.Concat(vmPolicyMaps, []string{egressProxy4, egressProxy6}))
	return out
}

// checkTableOwner refuses a table of our name, in either family, that does
// not carry our mark.
func checkTableOwner(ctx context.Context, id string) error {
	for _, f := range tableFamilies {
		mark, exists, err := hostnet.TableMark(ctx, f, hostnet.TableName(id))
		if err != nil {
			return err
		}
		switch mid, marked := hostnet.MarkedID(mark); {
		case !exists:
		case !marked || mid != id:
			return fmt.Errorf("network %q: nftables table %s %s exists but is not vmnetctl's (comment %q); remove or rename it",
				id, f, hostnet.TableName(id), mark)
		case !hostnet.Ours(mark):
			return fmt.Errorf("network %q: nftables table %s %s belongs to network %q of another vmnetctl state dir (comment %q); give the network another name in this one",
				id, f, hostnet.TableName(id), mid, mark)
		}
	}
	return nil
}

// removeTable deletes network id's tables, in both families, that exist and
// are marked ours.
func removeTable(ctx context.Context, id string) error {
	for _, f := range tableFamilies {
		mark, exists, err := hostnet.TableMark(ctx, f, hostnet.TableName(id))
		if err != nil {
			return err
		}
		if mid, marked := hostnet.MarkedID(mark); !exists || !marked || mid != id || !hostnet.Ours(mark) {
			continue // not ours: leave it
		}
		nft, err := hostnet.NFT(f, id)
		if err != nil {
			return err
		}
		tx := nft.NewTransaction()
		tx.Delete(&knftables.Table{})
		if err := nft.Run(ctx, tx); err != nil && !knftables.IsNotFound(err) {
			return fmt.Errorf("network %q: deleting nftables table %s %s: %w", id, f, hostnet.TableName(id), err)
		}
	}
	return nil
}

// markedTables returns the network ids of every table, in either family,
// that carries a mark with this process's owner (mine).
func markedTables(ctx context.Context) ([]string, error) {
	if _, err := exec.LookPath("nft"); err != nil {
		return nil, nil // no nft, no tables of ours
	}
	var ids []string
	for _, f := range tableFamilies {
		out, err := exec.CommandContext(ctx, "nft", "list", "tables", string(f)).CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("nft list tables %s: %w: %s", f, err, strings.TrimSpace(string(out)))
		}
		for _, line := range strings.Split(string(out), "\n") {
			name, ok := strings.CutPrefix(strings.TrimSpace(line), "table "+string(f)+" ")
			if !ok || !strings.HasPrefix(name, hostnet.TablePrefix) {
				continue
			}
			mark, exists, err := hostnet.TableMark(ctx, f, name)
			if err != nil {
				return nil, err
			}
			if id, ok := hostnet.MarkedID(mark); exists && ok && hostnet.Mine(mark) && hostnet.TableName(id) == name && !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
	}
	return ids, nil
}

// namedCounters returns the packets of the counters of network id's table
// of family whose names start with prefix, by name: one netlink dump of
// the table's objects, in the calling thread's network namespace. (`nft
// list counters` reads the whole table, every port's rules with it: 2 s
// for a network of 1,000 ports, and status asks on every call.)
func namedCounters(_ context.Context, family knftables.Family, id, prefix string) (map[string]uint64, error) {
	conn, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	defer conn.CloseLasting()
	objs, err := conn.GetObjects(&nftables.Table{Name: hostnet.TableName(id), Family: nftables.TableFamily(hostnet.NFProto(family))})
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("network %q: reading the counters of table %s %s: %w", id, family, hostnet.TableName(id), err)
	}
	out := map[string]uint64{}
	for _, o := range objs {
		if c, ok := o.(*nftables.CounterObj); ok && strings.HasPrefix(c.Name, prefix) {
			out[c.Name] = c.Packets
		}
	}
	return out, nil
}
