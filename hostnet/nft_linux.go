package hostnet

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"
)

// NFT is the knftables handle of network id's table of a family, made
// once per process: knftables.New runs nft twice to check it works, which
// every guard change of every helper paid before its own command. A handle
// runs its commands in the network namespace of the thread that calls it.
func NFT(family knftables.Family, id string) (knftables.Interface, error) {
	key := string(family) + " " + TableName(id)
	if nft, ok := nftHandles.Load(key); ok {
		return nft.(knftables.Interface), nil
	}
	nft, err := knftables.New(family, TableName(id))
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	kept, _ := nftHandles.LoadOrStore(key, nft)
	return kept.(knftables.Interface), nil
}

// DeleteElement adds to tx the deletion of element e whether or not the
// kernel still holds it: added first (a no-op if it is there), so that the
// delete finds it. A batch made from what was read a moment ago then never
// fails on an element someone else removed since (one missing element
// failed the whole batch: "delete element ... No such file or
// directory", and the guard drifted from the learner until the next
// resync).
func DeleteElement(tx *knftables.Transaction, e *knftables.Element) {
	tx.Add(e)
	tx.Delete(e)
}

// nftHandles holds NFT's handles, by family and table.
var nftHandles sync.Map

// TableMark returns the comment of table name of a family, and whether it
// exists (TableComment: the table alone, not `nft list table`, which lists
// every port's chain). Without nft installed there is no table vmnetctl
// could have made.
func TableMark(_ context.Context, family knftables.Family, name string) (string, bool, error) {
	if _, err := exec.LookPath("nft"); err != nil {
		return "", false, nil
	}
	return TableComment(family, name)
}

// SetElements reads the elements of set name of network id's table of
// family through netlink (one small request, whatever else the table
// holds), with their counters; none without the set or the table.
func SetElements(family nftables.TableFamily, id, name string) ([]nftables.SetElement, error) {
	conn, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	set, err := conn.GetSetByName(&nftables.Table{Name: TableName(id), Family: family}, name)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return conn.GetSetElements(set)
}

// TableListing returns nft's listing of network id's table of a family
// (`nft list table`), or "" without one. It is the one text read of a
// table: the drift check compares the rules as nft lists them with the
// rules as they were written through nft (knftables); everything else is
// read through netlink (SetElements, TableComment, ...).
//
// A table that holds an xtables target (the name check's queue on a
// kernel without nftables' own: netplane's writeQueueRule) is listed by
// nft with a warning that iptables-nft manages it, and libxtables's
// complaints about the inet family on stderr: neither is part of the
// listing.
func TableListing(ctx context.Context, family knftables.Family, id string) (string, error) {
	if _, err := exec.LookPath("nft"); err != nil {
		return "", nil
	}
	var stderr strings.Builder
	cmd := exec.CommandContext(ctx, "nft", "list", "table", string(family), TableName(id))
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if strings.Contains(stderr.String(), "No such file or directory") {
			return "", nil
		}
		return "", fmt.Errorf("nft list table %s %s: %w: %s", family, TableName(id), err, strings.TrimSpace(stderr.String()))
	}
	listing := string(out)
	if first, rest, ok := strings.Cut(listing, "\n"); ok && strings.HasPrefix(first, "# Warning: ") && strings.Contains(first, "iptables-nft") {
		listing = rest
	}
	return listing, nil
}
