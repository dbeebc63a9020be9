package netplane

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// asOwner makes the process's owner that of stateDir until the test ends.
func asOwner(t *testing.T, stateDir string) {
	t.Helper()
	hostnet.SetOwner(stateDir)
	t.Cleanup(func() { hostnet.SetOwner("") })
}

// markAs is mark (TapMark or Mark of its argument) as the state dir
// stateDir makes it.
func markAs(stateDir string, mark func() string) string {
	prev := hostnet.OwnerDir()
	hostnet.SetOwner(stateDir)
	defer hostnet.SetOwner(prev)
	return mark()
}

// linkExists tells whether link name exists, in the calling thread's
// namespace.
func linkExists(name string) bool {
	_, err := netlink.LinkByName(name)
	return !hostnet.NotFound(err)
}

// TestTmpBridgeOwner: a bridge creation cut short between the link's
// creation and its mark leaves a temporary bridge whose name carries the
// state dir's owner: the next creation of the network and Sweep remove it,
// and never another state dir's (which may be creating it right now) nor
// one of a process without an owner.
func TestTmpBridgeOwner(t *testing.T) {
	needRoot(t)
	host := testutil.NewNS(t, "tmpbr")
	const a, b = "/state/a", "/state/b"
	n := testNet("tb", api.ModeHost, "10.200.40.0/24")
	nameA := markAs(a, func() string { return hostnet.TmpBridgeName(n.ID) })
	nameB := markAs(b, func() string { return hostnet.TmpBridgeName(n.ID) })
	other := markAs(a, func() string { return hostnet.TmpBridgeName("other") })
	if nameA == nameB || len(nameA) > 15 || !strings.HasPrefix(nameA, hostnet.TmpBridgePrefix) {
		t.Fatalf("temporary names %q (a) and %q (b): want two apart, within IFNAMSIZ", nameA, nameB)
	}
	if o, ok := hostnet.TmpBridgeOwner(nameA); !ok || o != markAs(a, hostnet.Owner) {
		t.Fatalf("hostnet.TmpBridgeOwner(%q) = %q, %v; want a's owner", nameA, o, ok)
	}
	// The kernel does not apply an alias given at creation: the name is
	// what attributes a bridge cut short before its mark.
	aliased := netlink.NewLinkAttrs()
	aliased.Name, aliased.Alias = "vmnx-alias", "vmnetctl:network=x"
	host.MustDo(t, func() error {
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: aliased}); err != nil {
			return err
		}
		l, err := netlink.LinkByName(aliased.Name)
		if err == nil && l.Attrs().Alias != "" {
			t.Logf("this kernel applies IFLA_IFALIAS at creation (%q)", l.Attrs().Alias)
		}
		return err
	})
	// Cut short: a's creation of tb and of other before the mark, b's
	// creation of tb, and a temporary bridge of a process without owner.
	for _, name := range []string{nameA, nameB, other, "vmn.0123abcd"} {
		host.MustRun(t, "ip", "link", "add", name, "type", "bridge")
	}

	asOwner(t, a)
	host.MustDo(t, func() error { return Ensure(context.Background(), n) })
	host.MustDo(t, func() error {
		if l, err := netlink.LinkByName(n.Bridge()); err != nil || l.Attrs().Alias != hostnet.Mark(n.ID) {
			return fmt.Errorf("bridge %s after Ensure: %v", n.Bridge(), err)
		}
		for name, want := range map[string]bool{nameA: false, nameB: true, other: true, "vmn.0123abcd": true} {
			if linkExists(name) != want {
				return fmt.Errorf("after a's Ensure of %s: %s exists: %v, want %v", n.ID, name, !want, want)
			}
		}
		return nil
	})
	host.MustDo(t, func() error {
		_, err := Sweep(context.Background(), nil, t.TempDir())
		return err
	})
	host.MustDo(t, func() error {
		for name, want := range map[string]bool{n.Bridge(): false, other: false, nameB: true, "vmn.0123abcd": true} {
			if linkExists(name) != want {
				return fmt.Errorf("after a's Sweep: %s exists: %v, want %v", name, !want, want)
			}
		}
		return nil
	})
}

// TestPortOwners: the VM ports one state dir's helpers make carry its
// owner; another state dir neither deletes them (RemoveStaleTap, Remove,
// Sweep) nor takes them over (a TAP or macvtap of the same name is a clear
// error), while its own go. A TAP marked before owners goes only when no
// process holds it.
func TestPortOwners(t *testing.T) {
	needRoot(t)
	host := testutil.NewNS(t, "portown")
	const a, b = "/state/a", "/state/b"
	host.MustRun(t, "ip", "link", "add", "uplink0", "type", "veth", "peer", "name", "uplink0p")
	host.MustRun(t, "ip", "link", "set", "uplink0", "up")
	lan := &api.Network{ID: "lan", Name: "lan", Mode: api.ModeBridged, Interface: "uplink0", MTU: 1500}
	tap := func(name, alias string) {
		host.MustRun(t, "ip", "tuntap", "add", "dev", name, "mode", "tap")
		host.MustRun(t, "ip", "link", "set", name, "alias", alias)
	}
	tap("vmt-a", markAs(a, func() string { return hostnet.TapMark("vmt-a") }))
	tap("vmt-b", markAs(b, func() string { return hostnet.TapMark("vmt-b") }))
	tap("vmt-old", hostnet.TapMarkPrefix+"vmt-old")
	macvtap := func(name, alias string) {
		host.MustRun(t, "ip", "link", "add", "link", "uplink0", "name", name, "type", "macvtap", "mode", "bridge")
		host.MustRun(t, "ip", "link", "set", name, "alias", alias)
	}
	macvtap("mvt-b", markAs(b, func() string { return hostnet.Mark(lan.ID) }))
	macvtap("mvt-old", hostnet.Mark(lan.ID)) // without an owner

	asOwner(t, a)
	host.MustDo(t, func() error {
		// A TAP of b's: not stale for a, and a clash names its owner.
		if err := RemoveStaleTap("vmt-b"); err != nil || !linkExists("vmt-b") {
			return fmt.Errorf("RemoveStaleTap of b's TAP as a: %v; exists: %v", err, linkExists("vmt-b"))
		}
		if err := tapClash("vmt-b"); err == nil || !strings.Contains(err.Error(), "another vmnetctl state dir (owner "+markAs(b, hostnet.Owner)) {
			return fmt.Errorf("tapClash of b's TAP as a: %v", err)
		}
		// a's own TAP, held by a process (a helper a's controller lost
		// track of): not another state dir's, and not stale.
		fd, err := createTap(PortConfig{Name: "vmt-ah", UID: -1, GID: -1})
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err = tapClash("vmt-ah"); err == nil || !strings.Contains(err.Error(), "held by another helper of this state dir") || strings.Contains(err.Error(), "another vmnetctl state dir") {
			return fmt.Errorf("tapClash of a's own held TAP as a: %v", err)
		}
		_, err = CreateMacvtap(lan, "mvt-b", mustMAC("52:55:55:00:40:01"))
		if err == nil || !strings.Contains(err.Error(), "another vmnetctl state dir") {
			return fmt.Errorf("CreateMacvtap over b's macvtap as a: %v", err)
		}
		// a's own macvtap, created now, carries a's owner.
		mv, err := CreateMacvtap(lan, "mvt-a", mustMAC("52:55:55:00:40:02"))
		if err != nil {
			return err
		}
		if mv.Attrs().Alias != hostnet.Mark(lan.ID) || hostnet.MarkOwner(mv.Attrs().Alias) != hostnet.Owner() {
			return fmt.Errorf("a's macvtap is marked %q", mv.Attrs().Alias)
		}
		// Remove of lan takes a's macvtap only.
		if err := Remove(context.Background(), lan.ID, ""); err != nil {
			return err
		}
		for name, want := range map[string]bool{"mvt-a": false, "mvt-b": true, "mvt-old": true} {
			if linkExists(name) != want {
				return fmt.Errorf("after a's Remove of %s: %s exists: %v, want %v", lan.ID, name, !want, want)
			}
		}
		return nil
	})
	// A cleanup child of a's, whose port went, leaves b's port of the same
	// name alone, and an unmarked one (a's ports are marked before their
	// cleanup child starts: that one is someone else's), and deletes a's own.
	host.MustRun(t, "ip", "tuntap", "add", "dev", "vmt-unmarked", "mode", "tap")
	tap("vmt-a2", markAs(a, func() string { return hostnet.TapMark("vmt-a2") }))
	host.MustDo(t, func() error {
		for name, want := range map[string]bool{"vmt-b": true, "mvt-b": true, "vmt-a2": false, "vmt-unmarked": true} {
			if err := deletePortOnEOF(name, strings.NewReader("")); err != nil {
				return err
			}
			if linkExists(name) != want {
				return fmt.Errorf("after a's cleanup child for %s: it exists: %v, want %v", name, !want, want)
			}
		}
		return nil
	})
	// A TAP marked before owners, held by a process: left alone.
	var held *Port
	host.MustDo(t, func() error {
		if err := RemoveStaleTap("vmt-old"); err != nil || linkExists("vmt-old") {
			return fmt.Errorf("an unheld TAP marked without an owner survives a's RemoveStaleTap: %v", err)
		}
		fd, err := createTap(PortConfig{Name: "vmt-held", UID: -1, GID: -1})
		if err != nil {
			return err
		}
		held = &Port{Name: "vmt-held", FD: fd}
		l, err := netlink.LinkByName("vmt-held")
		if err == nil {
			err = netlink.LinkSetAlias(l, hostnet.TapMarkPrefix+"vmt-held")
		}
		return err
	})
	t.Cleanup(func() { held.Close() })
	// One of a's own that a live process holds (a helper of a's that was
	// not recorded still serves its VM): left alone too.
	var heldMine *Port
	host.MustDo(t, func() error {
		fd, err := createTap(PortConfig{Name: "vmt-heldmine", UID: -1, GID: -1})
		heldMine = &Port{Name: "vmt-heldmine", FD: fd}
		return err
	})
	t.Cleanup(func() { heldMine.Close() })
	host.MustDo(t, func() error {
		if err := RemoveStaleTap("vmt-heldmine"); err != nil || !linkExists("vmt-heldmine") {
			return fmt.Errorf("a held TAP of a's own, after a's RemoveStaleTap: %v; exists: %v", err, linkExists("vmt-heldmine"))
		}
		if err := RemoveStaleTap("vmt-held"); err != nil || !linkExists("vmt-held") {
			return fmt.Errorf("a held TAP marked without an owner, after a's RemoveStaleTap: %v; exists: %v", err, linkExists("vmt-held"))
		}
		if _, err := Sweep(context.Background(), nil, ""); err != nil {
			return err
		}
		for name, want := range map[string]bool{"vmt-a": false, "vmt-b": true, "vmt-held": true, "mvt-b": true, "mvt-old": true} {
			if linkExists(name) != want {
				return fmt.Errorf("after a's Sweep: %s exists: %v, want %v", name, !want, want)
			}
		}
		return nil
	})
}
