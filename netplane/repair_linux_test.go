package netplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/guard"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/nettypes"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestWatchChanges: the controller's watch reports a network's service that
// stopped on its own and a vmnetctl nftables table deleted, each on its own
// (a namespace with no vmnetctl link, so nothing else is reported). Links
// and addresses are TestDriftEvents'.
func TestWatchChanges(t *testing.T) {
	testutil.RequireRoot(t, "watches netlink in a network namespace")
	host := testutil.NewNS(t, "watch")
	changes := watchIn(t, host).C

	nw := &Network{n: &api.Network{ID: "w"}}
	nw.fail(errors.New("the DHCP server stopped"))
	reported(t, changes, 10*time.Second, "a service stopped")

	table := hostnet.TableName("w")
	host.MustRun(t, "nft", "add", "table", "inet", table) // not a change
	host.MustRun(t, "nft", "add", "chain", "inet", table, "c")
	host.MustRun(t, "nft", "delete", "table", "inet", table)
	reported(t, changes, 10*time.Second, "the table deleted")
}

// reported waits, up to within, for the watch's next report of a change,
// which what made.
func reported(t *testing.T, changes <-chan struct{}, within time.Duration, what string) {
	t.Helper()
	select {
	case <-changes:
	case <-time.After(within):
		t.Fatalf("no change reported after %s", what)
	}
}

// watchIn starts the controller's watch (WatchChanges) in host's
// namespace, until the test ends.
func watchIn(t *testing.T, host *testutil.NS) *Watch {
	t.Helper()
	w, _ := watchUntil(t, host)
	return w
}

// watchUntil is watchIn, with the function that ends the watch.
func watchUntil(t *testing.T, host *testutil.NS) (*Watch, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var w *Watch
	host.MustDo(t, func() (err error) {
		w, err = WatchChanges(ctx)
		return err
	})
	return w, cancel
}

// TestWatchNotices: the watch counts the notices that may concern a VM's
// port, by which the controller's resync leaves the ports unread while
// the count stands. The kernel's notices of each change, read on sockets
// of the test's own up to a mark of its own after them (the notices of a
// socket come in order), are judged as the watch judges them: a TAP off
// its bridge, or renamed on it, a TAP deleted, an element of a vmnetctl
// table deleted, a vmnetctl table's rules flushed, each may; somebody
// else's links (a bridge's port too) and table changed may not. The
// watch, begun with the test's sockets, counts as many as were judged so,
// and one that ended says it cannot tell.
func TestWatchNotices(t *testing.T) {
	testutil.RequireRoot(t, "watches netlink in a network namespace")
	host := testutil.NewNS(t, "notices")
	br, tap := api.BridgePrefix+"nt", api.TapPrefix+"nt0"
	table := hostnet.TableName("nt")
	host.MustRun(t, "ip", "link", "add", br, "type", "bridge")
	host.MustRun(t, "ip", "tuntap", "add", "dev", tap, "mode", "tap")
	host.MustRun(t, "ip", "link", "set", tap, "master", br)
	renamed := api.TapPrefix + "nt1"
	host.MustRun(t, "ip", "tuntap", "add", "dev", renamed, "mode", "tap")
	host.MustRun(t, "ip", "link", "set", renamed, "master", br)
	host.MustRun(t, "nft", "add table bridge "+table+"; add set bridge "+table+" s { type ether_addr; }; add chain bridge "+table+" c; add rule bridge "+table+" c ether saddr @s drop; add element bridge "+table+" s { 02:00:00:00:00:01 }")
	var links, tables *nl.NetlinkSocket
	host.MustDo(t, func() (err error) {
		if links, err = nl.Subscribe(unix.NETLINK_ROUTE, unix.RTNLGRP_LINK); err != nil {
			return err
		}
		t.Cleanup(links.Close)
		if tables, err = nl.Subscribe(unix.NETLINK_NETFILTER, unix.NFNLGRP_NFTABLES); err != nil {
			return err
		}
		t.Cleanup(tables.Close)
		return nil
	})
	for _, s := range []*nl.NetlinkSocket{links, tables} {
		if err := s.SetReceiveTimeout(&unix.Timeval{Sec: 30}); err != nil {
			t.Fatal(err)
		}
	}
	// The watch, from here on, sees what the test's sockets see.
	w, end := watchUntil(t, host)
	// until reads s's notices up to the mark's (isMark), and tells how
	// many of them the watch counts (counts), and how many came; total
	// is what the watch should have counted in all.
	marks, total := 0, 0
	until := func(s *nl.NetlinkSocket, isMark, counts func(syscall.NetlinkMessage) bool) (counted, n int) {
		t.Helper()
		defer func() { total += counted }()
		for {
			msgs, _, err := s.Receive()
			if err != nil {
				t.Fatalf("reading the notices: %v", err)
			}
			for _, m := range msgs {
				if isMark(m) {
					return counted, n
				}
				n++
				if counts(m) {
					counted++
				}
			}
		}
	}
	var h *netlink.Handle
	host.MustDo(t, func() (err error) {
		h, err = netlink.NewHandle(unix.NETLINK_ROUTE)
		return err
	})
	t.Cleanup(h.Close)
	nameOf := func(index int) string {
		if l, err := h.LinkByIndex(index); err == nil {
			return l.Attrs().Name
		}
		return ""
	}
	linkCounts := func(m syscall.NetlinkMessage) bool {
		u, ok := linkUpdate(m)
		return !ok || portNotice(u, nameOf)
	}
	// A link's mark: the loopback's alias, a new one each time.
	linkMark := func() func(syscall.NetlinkMessage) bool {
		marks++
		alias := fmt.Sprint("mark", marks)
		host.MustRun(t, "ip", "link", "set", "dev", "lo", "alias", alias)
		return func(m syscall.NetlinkMessage) bool {
			u, ok := linkUpdate(m)
			return ok && u.Link.Attrs().Alias == alias
		}
	}
	// A table's mark: somebody else's table, a new one each time.
	tableMark := func() func(syscall.NetlinkMessage) bool {
		marks++
		name := fmt.Sprint("mark", marks)
		host.MustRun(t, "nft", "add", "table", "inet", name)
		return func(m syscall.NetlinkMessage) bool {
			return m.Header.Type == unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWTABLE && nfAttr(m.Data, unix.NFTA_TABLE_NAME) == name
		}
	}
	until(links, linkMark(), linkCounts) // what making them said
	until(tables, tableMark(), ourTables)
	for _, c := range []struct {
		what    string
		do      string
		counted bool
	}{
		{"the loopback's alias", "ip link set dev lo alias x", false},
		{"somebody else's veth pair", "ip link add xa type veth peer name xb", false},
		{"somebody else's bridge and a port of it", "ip link add xbr type bridge; ip link set xa master xbr; ip link set xa name xc", false},
		{"somebody else's table, set, element and rule", "nft add table inet other; add set inet other s { type ipv4_addr; }; add element inet other s { 10.0.0.1 }; add chain inet other c; add rule inet other c ip saddr @s drop; delete element inet other s { 10.0.0.1 }", false},
		{"a TAP renamed on its bridge", "ip link set " + renamed + " name x1", true},
		{"a TAP taken off its bridge", "ip link set " + tap + " nomaster", true},
		{"the TAP put back and taken off again", "ip link set " + tap + " master " + br + "; ip link set " + tap + " nomaster", true},
		{"an element of a vmnetctl table deleted", "nft delete element bridge " + table + " s { 02:00:00:00:00:01 }", true},
		{"a vmnetctl table's rules flushed", "nft flush table bridge " + table, true},
		{"the TAP deleted", "ip link del " + tap, true},
	} {
		cmd := strings.Fields(c.do)
		s, mark, counts := links, linkMark, linkCounts
		if cmd[0] == "nft" {
			s, mark, counts = tables, tableMark, ourTables
			host.MustRun(t, "nft", strings.TrimPrefix(c.do, "nft "))
		} else {
			for _, one := range strings.Split(c.do, "; ") {
				f := strings.Fields(one)
				host.MustRun(t, f[0], f[1:]...)
			}
		}
		counted, n := until(s, mark(), counts)
		if n == 0 {
			t.Errorf("%s: no notice at all", c.what)
		}
		if (counted > 0) != c.counted {
			t.Errorf("%s: %d notices, %d counted, want counted: %v", c.what, n, counted, c.counted)
		}
	}
	// The watch counted them as they were judged here, no more.
	testutil.Eventually(t, 30*time.Second, func() bool {
		n, ok := w.Notices()
		return !ok || n >= uint64(total)
	}, "the watch counted fewer notices than %d", total)
	if n, ok := w.Notices(); !ok || n != uint64(total) {
		t.Errorf("the watch counted %d notices (can tell: %v), want %d", n, ok, total)
	}
	end()
	testutil.Eventually(t, 30*time.Second, func() bool { _, ok := w.Notices(); return !ok }, "a watch that ended says it can tell")
}

// TestWatchChangesAfterOverflow: a burst of link notices that overflows
// the watch's socket (a fleet's `up`; here the kernel's smallest buffer
// and a thousand notices at once) is reported as a change, and the watch
// goes on: a vmnetctl bridge deleted afterwards is reported too. (The
// watch used vishvananda/netlink's subscribers, which end at their
// socket's first error: it saw no link notice again.)
func TestWatchChangesAfterOverflow(t *testing.T) {
	testutil.RequireRoot(t, "watches netlink in a network namespace")
	defer func(b int) { watchBuffer = b }(watchBuffer)
	watchBuffer = 1 // raised to the kernel's least: a few notices
	host := testutil.NewNS(t, "overflow")
	bridges := []string{api.BridgePrefix + "ovf1", api.BridgePrefix + "ovf2"}
	for _, br := range bridges {
		host.MustRun(t, "ip", "link", "add", br, "type", "bridge")
	}
	w := watchIn(t, host)
	changes := w.C
	before, _ := w.Notices()
	// Bursts of notices of the loopback's alias (no vmnetctl link's:
	// not a change themselves) until one overflowed the socket and was
	// reported.
	batch := filepath.Join(t.TempDir(), "batch")
	made := 0
	testutil.Eventually(t, time.Minute, func() error {
		select {
		case <-changes:
			return nil
		default:
		}
		if made >= 10_000 {
			return errors.New("no overflow reported")
		}
		var b strings.Builder
		for range 1000 {
			fmt.Fprintf(&b, "link set dev lo alias a%d\n", made)
			made++
		}
		if err := os.WriteFile(batch, []byte(b.String()), 0o644); err != nil {
			return testutil.Permanent(err)
		}
		host.MustRun(t, "ip", "-batch", batch)
		return errors.New("no overflow reported yet")
	}, "a burst of link notices that overflowed the socket reported")
	// (None of the loopback's notices counts; those lost do.)
	if n, _ := w.Notices(); n == before {
		t.Error("the notices lost are not counted")
	}
	// Each deletion is reported: the first maybe by the report that the
	// socket's queue was emptied (the kernel drops notices until then),
	// the second by its own notice.
	for _, br := range bridges {
		select {
		case <-changes: // a report before this deletion
		default:
		}
		host.MustRun(t, "ip", "link", "del", br)
		reported(t, changes, 30*time.Second, "bridge "+br+" deleted after the overflow")
	}
}

// TestLinkChangedFleetChurn: the notices a fleet's VMs make as they come
// and go (a TAP made, put on its bridge, set up, its port's state, its
// deletion; a port's guard chain deleted) start no repair pass, each of
// which reads every port; drift does: a TAP taken off its bridge while
// up, a port not isolated on a bridge that isolates, a bridge deleted or
// down, a network's chain deleted.
func TestLinkChangedFleetChurn(t *testing.T) {
	isolating.set("vmn-iso", true)
	t.Cleanup(func() { isolating.set("vmn-iso", false) })
	names := map[int]string{7: "vmn-iso", 8: "vmn-open"}
	nameOf := func(i int) string { return names[i] }
	tap := func(master int, flags net.Flags, proto *netlink.Protinfo) netlink.Link {
		return &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: "vmt-0123456789", MasterIndex: master, Flags: flags, Protinfo: proto}}
	}
	bridge := func(flags net.Flags) netlink.Link {
		return &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "vmn-iso", Flags: flags}}
	}
	for _, c := range []struct {
		what string
		typ  uint16
		link netlink.Link
		want bool
	}{
		{"a TAP made, down", unix.RTM_NEWLINK, tap(0, 0, nil), false},
		{"a TAP put on its bridge", unix.RTM_NEWLINK, tap(8, 0, nil), false},
		{"a TAP set up on its bridge", unix.RTM_NEWLINK, tap(8, net.FlagUp, nil), false},
		{"a port's state, not isolating", unix.RTM_NEWLINK, tap(8, net.FlagUp, &netlink.Protinfo{}), false},
		{"a TAP put on an isolating bridge, down, before its isolation", unix.RTM_NEWLINK, tap(7, 0, &netlink.Protinfo{}), false},
		{"a port's state, isolated", unix.RTM_NEWLINK, tap(7, net.FlagUp, &netlink.Protinfo{Isolated: true}), false},
		{"a TAP deleted with its helper", unix.RTM_DELLINK, tap(8, net.FlagUp, nil), false},
		{"a TAP taken off its bridge", unix.RTM_NEWLINK, tap(0, net.FlagUp, nil), true},
		{"a port not isolated where it must be", unix.RTM_NEWLINK, tap(7, net.FlagUp, &netlink.Protinfo{}), true},
		{"a bridge deleted", unix.RTM_DELLINK, bridge(net.FlagUp), true},
		{"a bridge down", unix.RTM_NEWLINK, bridge(0), true},
		{"a bridge up", unix.RTM_NEWLINK, bridge(net.FlagUp), false},
		{"a link of somebody else's", unix.RTM_DELLINK, &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}}, false},
	} {
		u := netlink.LinkUpdate{Header: unix.NlMsghdr{Type: c.typ}, Link: c.link}
		if got := linkChanged(u, nameOf); got != c.want {
			t.Errorf("%s: linkChanged = %v, want %v", c.what, got, c.want)
		}
	}

	chainDeleted := func(table, chain string) syscall.NetlinkMessage {
		data := []byte{unix.NFPROTO_BRIDGE, 0, 0, 0}
		for _, a := range []struct {
			typ uint16
			val string
		}{{unix.NFTA_CHAIN_TABLE, table}, {unix.NFTA_CHAIN_NAME, chain}} {
			data = append(data, nl.NewRtAttr(int(a.typ), nl.ZeroTerminated(a.val)).Serialize()...)
		}
		return syscall.NetlinkMessage{Header: syscall.NlMsghdr{Type: unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_DELCHAIN}, Data: data}
	}
	if !tableDeleted(chainDeleted(hostnet.TableName("w"), guard.SetChecks)) {
		t.Error("the guard's chain deleted is not reported")
	}
	if !tableDeleted(chainDeleted(hostnet.TableName("w"), "forward")) {
		t.Error("a network's chain deleted is not reported")
	}
	if tableDeleted(chainDeleted("other", "forward")) {
		t.Error("somebody else's chain deleted is reported")
	}
}

// TestBriefLinks: the lean dump names the links as netlink.LinkList does,
// with their masters and aliases, over a dump of many messages (500
// links); and a link's name is found, or not, by its name alone.
func TestBriefLinks(t *testing.T) {
	testutil.RequireRoot(t, "makes links in a network namespace")
	host := testutil.NewNS(t, "brief")
	host.MustRun(t, "ip", "link", "add", "br-b", "type", "bridge")
	host.MustRun(t, "ip", "link", "add", "p-b", "master", "br-b", "type", "veth", "peer", "name", "p-c")
	host.MustRun(t, "ip", "link", "set", "p-b", "alias", "a port")
	var batch strings.Builder
	for i := range 250 {
		fmt.Fprintf(&batch, "link add d%d master br-b type veth peer name e%d\n", i, i)
	}
	batchFile := filepath.Join(t.TempDir(), "links")
	if err := os.WriteFile(batchFile, []byte(batch.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	host.MustRun(t, "ip", "-batch", batchFile)
	host.MustDo(t, func() error {
		brief, err := hostnet.BriefLinks()
		if err != nil {
			return err
		}
		full, err := netlink.LinkList()
		if err != nil {
			return err
		}
		var got, want []hostnet.BriefLink
		got = brief
		for _, l := range full {
			a := l.Attrs()
			want = append(want, hostnet.BriefLink{Index: a.Index, Master: a.MasterIndex, Name: a.Name, Alias: a.Alias})
		}
		if diff := cmp.Diff(want, got); diff != "" {
			return fmt.Errorf("hostnet.BriefLinks differs from netlink.LinkList (-want +got):\n%s", diff)
		}
		if !slices.ContainsFunc(got, func(l hostnet.BriefLink) bool { return l.Name == "p-b" && l.Alias == "a port" && l.Master != 0 }) {
			return fmt.Errorf("p-b, with its master and alias, not in %+v", got)
		}
		names, err := hostnet.OpenLinkNames()
		if err != nil {
			return err
		}
		defer names.Close()
		for _, l := range got {
			if name, ok := names.NameOf(uint32(l.Index)); !ok || name != l.Name {
				return fmt.Errorf("nameOf(%d) = %q, %v, want %q", l.Index, name, ok, l.Name)
			}
		}
		if name, ok := names.NameOf(1 << 30); !ok || name != "" {
			return fmt.Errorf("nameOf(an index no link has) = %q, %v, want \"\", true", name, ok)
		}
		return nil
	})
}

// TestPassesQuiet: what the controller gives a running network on every
// full pass, given again unchanged, deletes no vmnetctl table or chain, so
// that the controller's watch (WatchChanges) does not ask for another
// pass: impairments none when there are none (they once added and deleted
// their chains each time, and an idle controller passed without end, a
// core's worth of nft), partitions none; partitions given again as they
// are write nothing (a transaction ran nft on every pass). Clearing impairments that are
// set deletes their chains, once. The notices are read up to a sentinel
// table of nobody's, made and deleted last: none is missed.
func TestPassesQuiet(t *testing.T) {
	needRoot(t)
	host := testutil.NewNS(t, "quiet")
	n := testNet("q1", api.ModeShared, "10.200.61.0/24")
	nw := start(t, host, n, Options{})
	var events *nl.NetlinkSocket
	host.MustDo(t, func() (err error) {
		events, err = nl.Subscribe(unix.NETLINK_NETFILTER, unix.NFNLGRP_NFTABLES)
		return err
	})
	defer events.Close()
	// reported reads the notices up to the sentinel's deletion and
	// returns those the watch would report; partitionNotices counts
	// those of the partitions set's elements among them.
	partitionNotices, counted := 0, 0
	reported := func() []string {
		t.Helper()
		partitionNotices, counted = 0, 0
		host.MustRun(t, "nft", "add", "table", "inet", "sentinel")
		host.MustRun(t, "nft", "delete", "table", "inet", "sentinel")
		var out []string
		for {
			msgs, _, err := events.Receive()
			if err != nil {
				t.Fatalf("reading nftables' notices: %v", err)
			}
			for _, m := range msgs {
				if m.Header.Type == unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_DELTABLE && nfAttr(m.Data, unix.NFTA_TABLE_NAME) == "sentinel" {
					return out
				}
				if tableDeleted(m) {
					out = append(out, nfAttr(m.Data, unix.NFTA_CHAIN_TABLE)+" "+nfAttr(m.Data, unix.NFTA_CHAIN_NAME))
				}
				if ourTables(m) {
					counted++
				}
				switch m.Header.Type & 0xff {
				case unix.NFT_MSG_NEWSETELEM, unix.NFT_MSG_DELSETELEM:
					if nfAttr(m.Data, unix.NFTA_SET_ELEM_LIST_SET) == guard.SetPartitions {
						partitionNotices++
					}
				}
			}
		}
	}
	reported() // what starting the network made
	for range 2 {
		if err := nw.SetImpairments(nil); err != nil {
			t.Fatal(err)
		}
		if err := nw.SetPartitions(nil); err != nil {
			t.Fatal(err)
		}
	}
	if got := reported(); len(got) > 0 {
		t.Errorf("passes that change nothing deleted %q", got)
	}
	// Partitions given again as they are: nothing written (the set is
	// read first); others: written.
	a, b := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 1}, net.HardwareAddr{0x52, 0x54, 0, 0, 0, 2}
	pairs := [][2]net.HardwareAddr{{a, b}, {b, a}}
	if err := nw.SetPartitions(pairs); err != nil {
		t.Fatal(err)
	}
	if reported(); partitionNotices == 0 {
		t.Fatal("partitions set: no notice of the set's elements (the test cannot see them)")
	}
	for range 2 {
		if err := nw.SetPartitions(pairs); err != nil {
			t.Fatal(err)
		}
	}
	if reported(); partitionNotices > 0 {
		t.Errorf("partitions given again as they were: %d notices of the set's elements, want none", partitionNotices)
	}
	if err := nw.SetPartitions(pairs[:1]); err != nil {
		t.Fatal(err)
	}
	if reported(); partitionNotices == 0 {
		t.Error("partitions changed: no notice of the set's elements")
	}
	if err := nw.SetPartitions(nil); err != nil {
		t.Fatal(err)
	}
	imp := []nettypes.PortImpairment{{Port: "vmt-q", Impairment: api.Impairment{LossToVM: api.LossScale / 10}}}
	set := func() {
		t.Helper()
		if err := nw.SetImpairments(imp); err != nil {
			t.Fatal(err)
		}
	}
	set()
	if reported(); counted == 0 {
		t.Fatal("an impairment set: no notice of the guard's table (the test cannot see them)")
	}
	for range 2 {
		set()
	}
	if got := reported(); len(got) > 0 || counted > 0 {
		t.Errorf("setting an impairment again as it is deleted %q, and made %d notices the watch counts, want none", got, counted)
	}
	// Changed behind its back (a rule, a chain's policy): written again.
	// (Counters that counted are not a change: guard's
	// TestImpairmentsAsWritten.)
	table := hostnet.TableName(n.ID)
	for _, drift := range []string{
		"flush chain bridge " + table + " impair-to",
		"add rule bridge " + table + " impair-from accept",
		"add chain bridge " + table + " impair-to { type filter hook postrouting priority filter; policy drop; }",
	} {
		host.MustRun(t, "nft", drift)
		reported()
		set()
		if reported(); counted == 0 {
			t.Errorf("after %q, the impairment was not written again", drift)
		}
		from, to := host.MustRun(t, "nft", "list", "chain", "bridge", table, "impair-from"), host.MustRun(t, "nft", "list", "chain", "bridge", table, "impair-to")
		if out := from + to; !strings.Contains(to, "numgen random mod 10000 < 1000") || strings.Contains(out, "policy drop") || slices.Contains(strings.Fields(from), "accept") {
			t.Errorf("after %q and the impairment set again:\n%s", drift, out)
		}
	}
	for range 2 {
		if err := nw.SetImpairments(nil); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := reported(), []string{table + " impair-from", table + " impair-to"}; !slices.Equal(got, want) {
		t.Errorf("clearing an impairment twice deleted %q, want %q once", got, want)
	}
}
