package netplane

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strings"

	"github.com/vmnetctl/vmnetctl/api"
	"sigs.k8s.io/knftables"
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
}

func newNFT(id string) (knftables.Interface, error) {
	nft, err := knftables.New(knftables.InetFamily, TableName(id))
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	return nft, nil
}

// ensureTable replaces network n's table with its rules in one transaction:
// the table is created if needed, deleted with whatever it held, and built
// again, so the result never depends on what was there.
func ensureTable(ctx context.Context, n *api.Network) error {
	if err := checkTableOwner(ctx, n.ID); err != nil {
		return err
	}
	nft, err := newNFT(n.ID)
	if err != nil {
		return err
	}
	rules := nftRules(n)
	comment := Mark(n.ID)
	tx := nft.NewTransaction()
	tx.Add(&knftables.Table{Comment: &comment})
	tx.Delete(&knftables.Table{})
	tx.Add(&knftables.Table{Comment: &comment})
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
		return fmt.Errorf("network %q: installing nftables table inet %s: %w", n.ID, TableName(n.ID), err)
	}
	return nil
}

var tableCommentRe = regexp.MustCompile(`(?m)^\s*comment "([^"]*)"`)

// tableMark returns the comment of table inet name, and whether it exists.
// Without nft installed there is no table vmnetctl could have made.
func tableMark(ctx context.Context, name string) (string, bool, error) {
	if _, err := exec.LookPath("nft"); err != nil {
		return "", false, nil
	}
	out, err := exec.CommandContext(ctx, "nft", "list", "table", "inet", name).CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "No such file or directory") {
			return "", false, nil
		}
		return "", false, fmt.Errorf("nft list table inet %s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	// The table's own comment comes before its first chain.
	head, _, _ := strings.Cut(string(out), "\n\tchain ")
	if m := tableCommentRe.FindStringSubmatch(head); m != nil {
		return m[1], true, nil
	}
	return "", true, nil
}

// checkTableOwner refuses a table of our name that does not carry our mark.
func checkTableOwner(ctx context.Context, id string) error {
	mark, exists, err := tableMark(ctx, TableName(id))
	if err != nil {
		return err
	}
	if exists && mark != Mark(id) {
		return fmt.Errorf("network %q: nftables table inet %s exists but is not vmnetctl's (comment %q); remove or rename it",
			id, TableName(id), mark)
	}
	return nil
}

// removeTable deletes network id's table if it exists and is marked ours.
func removeTable(ctx context.Context, id string) error {
	mark, exists, err := tableMark(ctx, TableName(id))
	if err != nil || !exists {
		return err
	}
	if mark != Mark(id) {
		return nil // not ours: leave it
	}
	nft, err := newNFT(id)
	if err != nil {
		return err
	}
	tx := nft.NewTransaction()
	tx.Delete(&knftables.Table{})
	if err := nft.Run(ctx, tx); err != nil && !knftables.IsNotFound(err) {
		return fmt.Errorf("network %q: deleting nftables table inet %s: %w", id, TableName(id), err)
	}
	return nil
}

// markedTables returns the network ids of every table that carries a mark.
func markedTables(ctx context.Context) ([]string, error) {
	if _, err := exec.LookPath("nft"); err != nil {
		return nil, nil // no nft, no tables of ours
	}
	out, err := exec.CommandContext(ctx, "nft", "list", "tables", "inet").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("nft list tables: %w: %s", err, strings.TrimSpace(string(out)))
	}
	var ids []string
	for _, line := range strings.Split(string(out), "\n") {
		name, ok := strings.CutPrefix(strings.TrimSpace(line), "table inet ")
		if !ok || !strings.HasPrefix(name, tablePrefix) {
			continue
		}
		mark, exists, err := tableMark(ctx, name)
		if err != nil {
			return nil, err
		}
		if id, ok := markedID(mark); exists && ok && TableName(id) == name {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// tableRuleset returns `nft list table` of network id, or "" without one.
func tableRuleset(ctx context.Context, id string) (string, error) {
	if _, err := exec.LookPath("nft"); err != nil {
		return "", nil
	}
	out, err := exec.CommandContext(ctx, "nft", "list", "table", "inet", TableName(id)).CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "No such file or directory") {
			return "", nil
		}
		return "", fmt.Errorf("nft list table inet %s: %w", TableName(id), err)
	}
	return string(out), nil
}
