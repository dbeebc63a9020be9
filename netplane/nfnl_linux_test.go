package netplane

import (
	"net"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink"

	"github.com/vmnetctl/vmnetctl/guard"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestHasElement: one element looked up through netlink, as `nft get
// element` answers: in a MAC set and in a MAC . ifname set, present or
// not, and nothing in a set or a table that does not exist.
func TestHasElement(t *testing.T) {
	needRoot(t)
	host := testutil.NewNS(t, "he-host")
	table := hostnet.TableName("he")
	host.MustRun(t, "nft", "add", "table", "bridge", table)
	host.MustRun(t, "nft", "add", "set", "bridge", table, guard.SetClaimed, "{ type ether_addr; }")
	host.MustRun(t, "nft", "add", "set", "bridge", table, guard.SetOwns, "{ type ether_addr . ifname; }")
	host.MustRun(t, "nft", "add", "element", "bridge", table, guard.SetClaimed, "{ 52:54:00:00:00:01 }")
	host.MustRun(t, "nft", "add", "element", "bridge", table, guard.SetOwns, `{ 52:54:00:00:00:01 . "vmt-a" }`)
	mac := func(s string) []byte { hw, _ := net.ParseMAC(s); return hw }
	for _, tc := range []struct {
		id, set string
		key     []byte
		want    bool
	}{
		{"he", guard.SetClaimed, mac("52:54:00:00:00:01"), true},
		{"he", guard.SetClaimed, mac("52:54:00:00:00:02"), false},
		{"he", guard.SetOwns, guard.OwnsKey(guard.PortMAC{MAC: "52:54:00:00:00:01", Port: "vmt-a"}), true},
		{"he", guard.SetOwns, guard.OwnsKey(guard.PortMAC{MAC: "52:54:00:00:00:01", Port: "vmt-b"}), false},
		{"he", guard.SetExpected, mac("52:54:00:00:00:01"), false}, // no such set
		{"nosuch", guard.SetClaimed, mac("52:54:00:00:00:01"), false},
	} {
		var got bool
		host.MustDo(t, func() (err error) {
			got, err = hostnet.HasElement(tc.id, tc.set, tc.key)
			return err
		})
		if got != tc.want {
			t.Errorf("%s %s %x: %v, want %v", tc.id, tc.set, tc.key, got, tc.want)
		}
	}
}

// TestNFTGeneration: the generation counts committed transactions of the
// namespace, not reads, and not another namespace's.
func TestNFTGeneration(t *testing.T) {
	needRoot(t)
	host := testutil.NewNS(t, "gen-host")
	other := testutil.NewNS(t, "gen-other")
	gen := func(ns *testutil.NS) (g uint32) {
		t.Helper()
		ns.MustDo(t, func() (err error) {
			g, err = hostnet.NFTGeneration()
			return err
		})
		return g
	}
	g0 := gen(host)
	host.MustRun(t, "nft", "list", "ruleset")
	if g := gen(host); g != g0 {
		t.Fatalf("a listing moved the generation from %d to %d", g0, g)
	}
	host.MustRun(t, "nft", "add", "table", "bridge", "gen-t")
	g1 := gen(host)
	if g1 == g0 {
		t.Fatalf("a new table left the generation at %d", g0)
	}
	o0 := gen(other)
	other.MustRun(t, "nft", "add", "table", "bridge", "gen-t")
	if o := gen(other); o == o0 {
		t.Fatalf("the other namespace's generation stayed %d", o)
	}
	if g := gen(host); g != g1 {
		t.Fatalf("another namespace's table moved this one's generation from %d to %d", g1, g)
	}
}

// TestAddrsOf: a link's addresses as the kernel filters them by index are
// netlink.AddrList's: IPv4 with a peer and without, a label, IPv6, and
// none of another link's.
func TestAddrsOf(t *testing.T) {
	needRoot(t)
	host := testutil.NewNS(t, "ao-host")
	for _, l := range []string{"ao0", "ao1"} {
		host.MustRun(t, "ip", "link", "add", l, "type", "bridge")
		host.MustRun(t, "ip", "link", "set", l, "up")
	}
	host.MustRun(t, "ip", "addr", "add", "10.9.0.1/24", "dev", "ao0", "label", "ao0:x")
	host.MustRun(t, "ip", "addr", "add", "10.9.1.1", "peer", "10.9.1.2/32", "dev", "ao0")
	host.MustRun(t, "ip", "addr", "add", "fd00:9::1/64", "dev", "ao0", "nodad")
	host.MustRun(t, "ip", "addr", "add", "10.9.2.1/24", "brd", "+", "dev", "ao1")
	host.MustRun(t, "ip", "addr", "add", "fd00:9:1::1/64", "dev", "ao1", "nodad")
	host.MustDo(t, func() error {
		for _, name := range []string{"ao0", "ao1"} {
			link, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
				got, err := hostnet.AddrsOf(link, family)
				if err != nil {
					return err
				}
				want, err := netlink.AddrList(link, family)
				if err != nil {
					return err
				}
				// (Lifetimes count down between the two dumps.)
				for _, as := range [][]netlink.Addr{got, want} {
					for i := range as {
						as[i].PreferedLft, as[i].ValidLft = 0, 0
					}
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("%s, family %d (-AddrList +AddrsOf):\n%s", name, family, diff)
				}
				if len(got) == 0 {
					t.Errorf("%s, family %d: no address", name, family)
				}
			}
		}
		return nil
	})
}

// TestAddrsOfGone: a link gone has no addresses, as netlink.AddrList
// says, not an error.
func TestAddrsOfGone(t *testing.T) {
	needRoot(t)
	host := testutil.NewNS(t, "aog-host")
	host.MustDo(t, func() error {
		got, err := hostnet.AddrsOf(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Index: 9999, Name: "gone"}}, netlink.FAMILY_V4)
		if err != nil || len(got) != 0 {
			t.Errorf("a link gone: %v, %v; want none, no error", got, err)
		}
		return nil
	})
}
