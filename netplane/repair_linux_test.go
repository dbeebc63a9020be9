package netplane

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestWatchChanges: the controller's watch reports a network's service that
// stopped on its own and a vmnetctl nftables table deleted, each on its own
// (a namespace with no vmnetctl link, so nothing else is reported). Links
// and addresses are TestDriftEvents'.
func TestWatchChanges(t *testing.T) {
	testutil.RequireRoot(t, "watches netlink in a network namespace")
	host := testutil.NewNS(t, "watch")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var changes <-chan struct{}
	mustDo(t, host, func() (err error) {
		changes, err = WatchChanges(ctx)
		return err
	})
	reported := func(what string) {
		t.Helper()
		select {
		case <-changes:
		case <-time.After(10 * time.Second):
			t.Fatalf("no change reported after %s", what)
		}
	}

	nw := &Network{n: &api.Network{ID: "w"}}
	nw.fail(errors.New("the DHCP server stopped"))
	reported("a service stopped")

	table := TableName("w")
	host.MustRun(t, "nft", "add", "table", "inet", table) // not a change
	host.MustRun(t, "nft", "add", "chain", "inet", table, "c")
	host.MustRun(t, "nft", "delete", "table", "inet", table)
	reported("the table deleted")
}
