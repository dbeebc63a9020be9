package controller

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/vmnetctl/vmnetctl/backend"
	"github.com/vmnetctl/vmnetctl/spec"
)

// hostTold is what setHosts last told a network of an attachment.
type hostTold struct {
	nw      backend.Network // nil while the attachment's network is not up
	mac, vm string
	ip      netip.Addr
	failed  bool // SetHost failed: told again on the next pass
}

// netMAC is a MAC on a running network.
type netMAC struct {
	nw  backend.Network
	mac string
}

// hostState is what setHosts told the networks: by attachment key, what
// it last told of each (told) and the pass that last saw it (pass
// counts them); and counts of what that holds: the attachments of each
// VM name in lower case (the state dir's names, which no network gives a
// DHCP client, whatever their case), those of each MAC on each running
// network, and the networks that had a round (SetVMs), which a later
// round only tells of what changed (ChangeVMs).
type hostState struct {
	told  map[string]*told
	pass  uint64
	names map[string]int
	macs  map[netMAC]int
	nets  map[backend.Network]bool
}

// told is what setHosts last told of an attachment, and the pass that
// last saw it among the desired attachments.
type told struct {
	hostTold
	pass uint64
}

// setHosts gives the networks' DHCP and DNS the VMs' names and fixed
// addresses, and ends the round on each network (backend.Network's
// SetVMs, ChangeVMs). A pass asked for tells a network only of the
// attachments new or changed since the last (hostState), and of the names
// and MACs that left since: the same cost with a thousand VMs as with
// none, what it keeps changed in place (an attachment that stays costs a
// lookup). The full passes, and a network started again since, are told
// of every attachment and name, which puts back what changed behind the
// controller's back (a guard's binding).
func (c *Controller) setHosts(desired *spec.Desired, full bool) []error {
	if full || c.hosts.told == nil {
		c.hosts = hostState{told: map[string]*told{}, names: map[string]int{}, macs: map[netMAC]int{}, nets: map[backend.Network]bool{}}
	}
	c.hosts.pass++
	var errs []error
	var ch hostChanges
	for _, a := range desired.Attachments {
		key := a.Key()
		t := hostTold{nw: c.nets[a.Network], mac: a.MAC, vm: a.VM, ip: a.IP}
		e := c.hosts.told[key]
		if e != nil && e.hostTold == t {
			e.pass = c.hosts.pass
			continue
		}
		if e == nil {
			e = &told{}
			c.hosts.told[key] = e
			c.hosts.addName(t.vm, &ch)
		} else {
			c.hosts.dropMAC(e.hostTold, &ch)
		}
		c.hosts.addMAC(t)
		if t.nw != nil {
			if err := t.nw.SetHost(mustMAC(a.MAC), a.VM, a.IP); err != nil {
				errs = append(errs, fmt.Errorf("attachment %s: %w", key, err))
				t.failed = true
			}
		}
		e.hostTold, e.pass = t, c.hosts.pass
	}
	for key, e := range c.hosts.told {
		if e.pass != c.hosts.pass {
			c.hosts.dropName(e.vm, &ch)
			c.hosts.dropMAC(e.hostTold, &ch)
			delete(c.hosts.told, key)
		}
	}
	gone := ch.gone(&c.hosts)
	var names []string // for a network that has not had its round: every name and MAC
	var macs map[backend.Network][]net.HardwareAddr
	nets := make(map[backend.Network]bool, len(c.nets))
	for _, nw := range c.nets {
		nets[nw] = true
		if c.hosts.nets[nw] {
			nw.ChangeVMs(ch.added, ch.removed, gone[nw])
			continue
		}
		if names == nil {
			names, macs = slices.Collect(maps.Keys(c.hosts.names)), macsByNetwork(c.hosts.told)
		}
		nw.SetVMs(names, macs[nw])
	}
	c.hosts.nets = nets
	return errs
}

// hostChanges are what a pass changed of the counts: the names of the
// state dir added and removed, and the MACs that left a network (of
// which those no attachment there has any more are gone).
type hostChanges struct {
	added, removed []string
	left           []netMAC
}

// addName and dropName count an attachment of VM vm in and out; names
// are counted in lower case.
func (h *hostState) addName(vm string, ch *hostChanges) {
	name := strings.ToLower(vm)
	if h.names[name]++; h.names[name] == 1 {
		ch.added = append(ch.added, name)
	}
}

func (h *hostState) dropName(vm string, ch *hostChanges) {
	name := strings.ToLower(vm)
	if h.names[name]--; h.names[name] == 0 {
		delete(h.names, name)
		ch.removed = append(ch.removed, name)
	}
}

// addMAC and dropMAC count t's MAC on its network in and out (none while
// its network is not up).
func (h *hostState) addMAC(t hostTold) {
	if t.nw != nil {
		h.macs[netMAC{t.nw, t.mac}]++
	}
}

func (h *hostState) dropMAC(t hostTold, ch *hostChanges) {
	if t.nw == nil {
		return
	}
	k := netMAC{t.nw, t.mac}
	if h.macs[k]--; h.macs[k] == 0 {
		delete(h.macs, k)
		ch.left = append(ch.left, k)
	}
}

// gone is, by network, the MACs that left it and that none of its
// attachments has at the end of the pass (a MAC that left one attachment
// and came to another in the same pass has not gone).
func (ch *hostChanges) gone(h *hostState) map[backend.Network][]net.HardwareAddr {
	gone := map[backend.Network][]net.HardwareAddr{}
	seen := map[netMAC]bool{}
	for _, k := range ch.left {
		if h.macs[k] == 0 && !seen[k] {
			seen[k] = true
			gone[k.nw] = append(gone[k.nw], mustMAC(k.mac))
		}
	}
	return gone
}

// macsByNetwork is the MACs of the attachments told of, by network.
func macsByNetwork(m map[string]*told) map[backend.Network][]net.HardwareAddr {
	macs := map[backend.Network][]net.HardwareAddr{}
	for _, t := range m {
		if t.nw != nil {
			macs[t.nw] = append(macs[t.nw], mustMAC(t.mac))
		}
	}
	return macs
}
