package netplane

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink"

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

// TestBriefLinks: the lean dump names the links as netlink.LinkList does,
// with their masters and aliases; and a link's name is found, or not, by
// its name alone.
func TestBriefLinks(t *testing.T) {
	testutil.RequireRoot(t, "makes links in a network namespace")
	host := testutil.NewNS(t, "brief")
	host.MustRun(t, "ip", "link", "add", "br-b", "type", "bridge")
	host.MustRun(t, "ip", "link", "add", "p-b", "master", "br-b", "type", "veth", "peer", "name", "p-c")
	host.MustRun(t, "ip", "link", "set", "p-b", "alias", "a port")
	mustDo(t, host, func() error {
		brief, err := briefLinks()
		if err != nil {
			return err
		}
		full, err := netlink.LinkList()
		if err != nil {
			return err
		}
		var got, want []briefLink
		got = brief
		for _, l := range full {
			a := l.Attrs()
			want = append(want, briefLink{Index: a.Index, Master: a.MasterIndex, Name: a.Name, Alias: a.Alias})
		}
		if diff := cmp.Diff(want, got); diff != "" {
			return fmt.Errorf("briefLinks differs from netlink.LinkList (-want +got):\n%s", diff)
		}
		if !slices.ContainsFunc(got, func(l briefLink) bool { return l.Name == "p-b" && l.Alias == "a port" && l.Master != 0 }) {
			return fmt.Errorf("p-b, with its master and alias, not in %+v", got)
		}
		names, err := openLinkNames()
		if err != nil {
			return err
		}
		defer names.close()
		for name, want := range map[string]bool{"p-b": true, "br-b": true, "lo": true, "p-gone": false, "": false} {
			if got := names.exists(name); got != want {
				return fmt.Errorf("exists(%q) = %v, want %v", name, got, want)
			}
		}
		return nil
	})
}
