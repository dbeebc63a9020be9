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

// hostCounts count what hostsTold holds: the attachments of each VM name
// in lower case (the state dir's names, which no network gives a DHCP
// client, whatever their case), those of
// each MAC on each running network, and the networks that had a round
// (SetVMs), which a later round only tells of what changed (ChangeVMs).
type hostCounts struct {
	names map[string]int
	macs  map[netMAC]int
	nets  map[backend.Network]bool
}

// setHosts gives the networks' DHCP and DNS the VMs' names and fixed
// addresses, and ends the round on each network (backend.Network's
// SetVMs, ChangeVMs). A pass asked for tells a network only of the
// attachments new or changed since the last (hostsTold), and of the names
// and MACs that left since: the same cost with a thousand VMs as with
// none. The full passes, and a network started again since, are told of
// every attachment and name, which puts back what changed behind the
// controller's back (a guard's binding).
func (c *Controller) setHosts(desired *spec.Desired, full bool) []error {
	var errs []error
	told := make(map[string]hostTold, len(desired.Attachments))
	for _, a := range desired.Attachments {
		key := a.Key()
		t := hostTold{nw: c.nets[a.Network], mac: a.MAC, vm: a.VM, ip: a.IP}
		if !full && c.hostsTold[key] == t || t.nw == nil {
			told[key] = t
			continue
		}
		if err := t.nw.SetHost(mustMAC(a.MAC), a.VM, a.IP); err != nil {
			errs = append(errs, fmt.Errorf("attachment %s: %w", key, err))
			t.failed = true
		}
		told[key] = t
	}
	if full || c.hosts.names == nil {
		c.hosts = countHosts(told)
		c.hostsTold = told
		names, macs := slices.Collect(maps.Keys(c.hosts.names)), macsByNetwork(told)
		for _, nw := range c.nets {
			nw.SetVMs(names, macs[nw])
			c.hosts.nets[nw] = true
		}
		return errs
	}
	added, removed, gone := c.hosts.change(c.hostsTold, told)
	c.hostsTold = told
	var names []string // for a network started again: every name and MAC
	var macs map[backend.Network][]net.HardwareAddr
	nets := make(map[backend.Network]bool, len(c.nets))
	for _, nw := range c.nets {
		nets[nw] = true
		if c.hosts.nets[nw] {
			nw.ChangeVMs(added, removed, gone[nw])
			continue
		}
		if names == nil {
			names, macs = slices.Collect(maps.Keys(c.hosts.names)), macsByNetwork(told)
		}
		nw.SetVMs(names, macs[nw])
	}
	c.hosts.nets = nets
	return errs
}

// countHosts counts what told holds (no network has had its round yet).
func countHosts(told map[string]hostTold) hostCounts {
	h := hostCounts{names: map[string]int{}, macs: map[netMAC]int{}, nets: map[backend.Network]bool{}}
	for _, t := range told {
		h.names[strings.ToLower(t.vm)]++
		if t.nw != nil {
			h.macs[netMAC{t.nw, t.mac}]++
		}
	}
	return h
}

// change counts told where it counted was, and says what left: the names
// of the state dir added and removed, and by network the MACs that none
// of its attachments has any more. An attachment's key names its VM: an
// attachment kept keeps its name.
func (h *hostCounts) change(was, told map[string]hostTold) (added, removed []string, gone map[backend.Network][]net.HardwareAddr) {
	var left []netMAC
	for key, old := range was {
		t, kept := told[key]
		if kept && t.nw == old.nw && t.mac == old.mac {
			continue
		}
		if name := strings.ToLower(old.vm); !kept {
			if h.names[name]--; h.names[name] == 0 {
				delete(h.names, name)
				removed = append(removed, name)
			}
		}
		if old.nw != nil {
			k := netMAC{old.nw, old.mac}
			if h.macs[k]--; h.macs[k] == 0 {
				delete(h.macs, k)
				left = append(left, k)
			}
		}
	}
	for key, t := range told {
		old, had := was[key]
		if had && t.nw == old.nw && t.mac == old.mac {
			continue
		}
		if name := strings.ToLower(t.vm); !had {
			if h.names[name]++; h.names[name] == 1 {
				added = append(added, name)
			}
		}
		if t.nw != nil {
			h.macs[netMAC{t.nw, t.mac}]++
		}
	}
	// A MAC that left one attachment of a network and came to another
	// in the same pass has not gone.
	gone = map[backend.Network][]net.HardwareAddr{}
	for _, k := range left {
		if h.macs[k] == 0 {
			gone[k.nw] = append(gone[k.nw], mustMAC(k.mac))
		}
	}
	return added, removed, gone
}

// macsByNetwork is the MACs of the attachments told of, by network.
func macsByNetwork(told map[string]hostTold) map[backend.Network][]net.HardwareAddr {
	macs := map[backend.Network][]net.HardwareAddr{}
	for _, t := range told {
		if t.nw != nil {
			macs[t.nw] = append(macs[t.nw], mustMAC(t.mac))
		}
	}
	return macs
}
