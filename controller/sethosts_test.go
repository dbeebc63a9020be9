package controller

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/backend"
	"github.com/vmnetctl/vmnetctl/spec"
)

// hostsCounter is a network that records the VMs SetHost was told of.
type hostsCounter struct {
	backend.Network
	told []string
}

func (h *hostsCounter) SetHost(_ net.HardwareAddr, name string, _ netip.Addr) error {
	h.told = append(h.told, name)
	return nil
}

func (h *hostsCounter) SetVMs([]string, []net.HardwareAddr)              {}
func (h *hostsCounter) ChangeVMs([]string, []string, []net.HardwareAddr) {}

// hostsModel is a network that keeps what it was told as netplane does:
// the names of VMs by MAC, and the state dir's names (reserved).
type hostsModel struct {
	backend.Network
	hosts    map[string]string
	reserved map[string]bool
	rounds   map[string]int // SetVMs, ChangeVMs
}

func newHostsModel() *hostsModel {
	return &hostsModel{hosts: map[string]string{}, reserved: map[string]bool{}, rounds: map[string]int{}}
}

func (h *hostsModel) SetHost(mac net.HardwareAddr, name string, _ netip.Addr) error {
	h.hosts[mac.String()] = name
	return nil
}

func (h *hostsModel) SetVMs(names []string, macs []net.HardwareAddr) {
	h.rounds["SetVMs"]++
	h.reserved = map[string]bool{}
	for _, n := range names {
		h.reserved[strings.ToLower(n)] = true
	}
	keep := map[string]bool{}
	for _, m := range macs {
		keep[m.String()] = true
	}
	for m := range h.hosts {
		if !keep[m] {
			delete(h.hosts, m)
		}
	}
}

func (h *hostsModel) ChangeVMs(added, removed []string, gone []net.HardwareAddr) {
	h.rounds["ChangeVMs"]++
	for _, n := range removed {
		delete(h.reserved, strings.ToLower(n))
	}
	for _, n := range added {
		h.reserved[strings.ToLower(n)] = true
	}
	for _, m := range gone {
		delete(h.hosts, m.String())
	}
}

// TestSetHostsChangesAsFull: passes asked for, each told only of what
// changed since the last (ChangeVMs), leave every network with what a
// full pass from nothing gives it (SetVMs): the same VMs' names and the
// same names reserved, through VMs attached, detached, moved between
// networks, given another MAC, names that differ only in case, and a
// network started again; and each network is told of every VM only in
// its first round. Random sequences, seeded.
func TestSetHostsChangesAsFull(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	vms := []string{"a", "b", "c", "B", "d", "e"}
	for seq := range 200 {
		c := &Controller{nets: map[string]backend.Network{"n": newHostsModel(), "m": newHostsModel()}}
		for step := range 8 {
			if r.IntN(6) == 0 { // a network started again
				c.nets[[]string{"n", "m"}[r.IntN(2)]] = newHostsModel()
			}
			var atts []*spec.Attachment
			for _, vm := range vms {
				if r.IntN(3) == 0 {
					continue
				}
				nw := []string{"n", "m", "down"}[r.IntN(3)]
				mac := fmt.Sprintf("52:55:55:00:00:%02x", r.IntN(4)) // shared on purpose: MACs that move
				atts = append(atts, &spec.Attachment{Attachment: &api.Attachment{VM: vm, Network: nw, MAC: mac}})
			}
			// One attachment a MAC on a network (the resolver's rule).
			seen := map[string]bool{}
			atts = slices.DeleteFunc(atts, func(a *spec.Attachment) bool {
				k := a.Network + a.MAC
				defer func() { seen[k] = true }()
				return seen[k]
			})
			if errs := c.setHosts(&spec.Desired{Attachments: atts}, false); len(errs) > 0 {
				t.Fatal(errs)
			}
			for id, nw := range c.nets {
				want := newHostsModel()
				var names []string
				var macs []net.HardwareAddr
				for _, a := range atts {
					names = append(names, a.VM)
					if a.Network == id {
						want.SetHost(mustMAC(a.MAC), a.VM, netip.Addr{})
						macs = append(macs, mustMAC(a.MAC))
					}
				}
				want.SetVMs(names, macs)
				got := nw.(*hostsModel)
				if !maps.Equal(got.hosts, want.hosts) || !maps.Equal(got.reserved, want.reserved) {
					t.Fatalf("sequence %d, step %d, network %s: hosts %v, reserved %v; a full pass gives %v, %v", seq, step, id, got.hosts, got.reserved, want.hosts, want.reserved)
				}
				// Told of every VM once, in its first round; after, of
				// what changed.
				if got.rounds["SetVMs"] != 1 {
					t.Fatalf("sequence %d, step %d, network %s: rounds %v, want one SetVMs, the first", seq, step, id, got.rounds)
				}
			}
		}
	}
}

// TestSetHostsTellsChanges: a pass asked for tells a network only of the
// attachments new or changed since the last (a VM more costs one SetHost,
// not one for every VM that runs); a full pass, and a network started
// again, are told of every one.
func TestSetHostsTellsChanges(t *testing.T) {
	c := &Controller{nets: map[string]backend.Network{}}
	nw := &hostsCounter{}
	c.nets["n"] = nw
	att := func(vm, ip string) *spec.Attachment {
		a := &api.Attachment{VM: vm, Network: "n", MAC: "52:55:55:00:00:0" + vm[:1]}
		if ip != "" {
			a.IP = netip.MustParseAddr(ip)
		}
		return &spec.Attachment{Attachment: a}
	}
	pass := func(full bool, atts ...*spec.Attachment) []string {
		t.Helper()
		nw := c.nets["n"].(*hostsCounter)
		nw.told = nil
		if errs := c.setHosts(&spec.Desired{Attachments: atts}, full); len(errs) > 0 {
			t.Fatal(errs)
		}
		slices.Sort(nw.told)
		return nw.told
	}
	a, b := att("a", ""), att("b", "")
	for _, tc := range []struct {
		name string
		full bool
		atts []*spec.Attachment
		want []string
	}{
		{"the first pass", false, []*spec.Attachment{a, b}, []string{"a", "b"}},
		{"nothing changed", false, []*spec.Attachment{a, b}, nil},
		{"c attached", false, []*spec.Attachment{a, b, att("c", "")}, []string{"c"}},
		{"b's fixed address", false, []*spec.Attachment{a, att("b", "10.0.0.9"), att("c", "")}, []string{"b"}},
		{"a full pass", true, []*spec.Attachment{a, att("b", "10.0.0.9"), att("c", "")}, []string{"a", "b", "c"}},
		{"c detached, then back", false, []*spec.Attachment{a, att("b", "10.0.0.9")}, nil},
		{"c back", false, []*spec.Attachment{a, att("b", "10.0.0.9"), att("c", "")}, []string{"c"}},
	} {
		if got := pass(tc.full, tc.atts...); !slices.Equal(got, tc.want) {
			t.Errorf("%s: told of %v, want %v", tc.name, got, tc.want)
		}
	}
	c.nets["n"] = &hostsCounter{} // the network started again
	if got := pass(false, a, att("b", "10.0.0.9")); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("a network started again: told of %v, want a and b", got)
	}
}

// failingHosts is a network whose SetHost fails while fail is set.
type failingHosts struct {
	hostsCounter
	fail bool
}

func (h *failingHosts) SetHost(mac net.HardwareAddr, name string, ip netip.Addr) error {
	h.hostsCounter.SetHost(mac, name, ip)
	if h.fail {
		return fmt.Errorf("refused")
	}
	return nil
}

// TestSetHostsRetriesFailed: a VM whose SetHost failed is told again on
// the next pass asked for, and not after it succeeded.
func TestSetHostsRetriesFailed(t *testing.T) {
	nw := &failingHosts{fail: true}
	c := &Controller{nets: map[string]backend.Network{"n": nw}}
	d := &spec.Desired{Attachments: []*spec.Attachment{{Attachment: &api.Attachment{VM: "a", Network: "n", MAC: "52:55:55:00:00:0a"}}}}
	for i, want := range []struct {
		fail bool
		told int
		err  bool
	}{{true, 1, true}, {false, 2, false}, {false, 2, false}} {
		nw.fail = want.fail
		errs := c.setHosts(d, false)
		if len(nw.told) != want.told || (len(errs) > 0) != want.err {
			t.Errorf("pass %d: told %d times, errors %v; want %d, %v", i, len(nw.told), errs, want.told, want.err)
		}
	}
}
