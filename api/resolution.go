package api

import (
	"slices"
	"strings"
)

// Resolution is what resolved VM files took (their VMs' names, MACs,
// fixed addresses, ports and forwards), kept so that files can be added
// to it and taken out of it later, each at the cost of its own entries:
// the controller resolves a fleet's files once, then each project that
// comes or goes, where ResolveKeeping of every file on every pass grew
// with the fleet.
//
// Add and Remove give the files what ResolveKeeping of all the files at
// once would, or say they cannot (false) and leave the Resolution spent:
// whenever the files take something another also has (a name, a MAC, an
// address, a forward's host port, a limit), or a MAC would not be the one
// ResolveKeeping gives (which depends on the order in which it meets the
// entries). The caller then resolves all the files again, which also
// says what is wrong. A Resolution is for one Networks: resolve again
// when they change.
type Resolution struct {
	r     *resolver
	all   map[string]*Attachment    // every entry's MAC, managed or not
	files map[*VMFile][]*Attachment // each file's entries, managed or not
	spent bool
}

// ResolveAll is ResolveKeeping of files that also returns their
// Resolution, nil when there are diagnostics (errors or warnings) or two
// entries have one MAC.
func ResolveAll(nets *Networks, files []*VMFile, keep map[string]string) (*Resolution, Diagnostics) {
	n := countAttachments(files)
	x := &Resolution{r: newResolver(nets, n), all: make(map[string]*Attachment, n), files: make(map[*VMFile][]*Attachment, len(files))}
	entries := x.note(files) // (before resolve drops the entries of networks it does not manage)
	if ds := x.r.resolve(files, keep); len(ds) > 0 {
		return nil, ds
	}
	for _, a := range entries {
		if x.all[a.MAC] != nil {
			// Set on two entries, one of a network vmnetctl does not
			// manage (no error: its MAC is not checked): which one holds
			// it cannot be kept track of. Resolve all again.
			return nil, nil
		}
		x.all[a.MAC] = a
	}
	return x, nil
}

// note records each of files' entries as its file's, and returns them
// all.
func (x *Resolution) note(files []*VMFile) []*Attachment {
	var all []*Attachment
	for _, f := range files {
		var entries []*Attachment
		for _, vm := range f.VMs {
			entries = append(entries, vm.Attachments...)
		}
		x.files[f] = entries
		all = append(all, entries...)
	}
	return all
}

// Add resolves files (parsed, not yet resolved) beside those x holds, as
// ResolveKeeping of them all would, and reports whether it could. Each
// entry whose MAC vmnetctl derives takes the MAC keep gives it, else its
// first: a MAC some other entry has, or a set one some other entry has,
// is ResolveKeeping's to settle.
func (x *Resolution) Add(files []*VMFile, keep map[string]string) bool {
	if x.spent {
		return false
	}
	x.spent = true // until it is done
	entries := x.note(files)
	taken := make(map[string]bool, len(entries))
	for _, a := range entries {
		if a.MACDerived {
			continue
		}
		if x.all[a.MAC] != nil || taken[a.MAC] {
			return false
		}
		taken[a.MAC] = true
	}
	for _, a := range entries {
		if !a.MACDerived {
			continue
		}
		mac, kept := keep[a.Key()]
		if kept {
			if !a.derivedFor(mac) {
				return false
			}
		} else {
			mac, _ = a.derivedMACs()
		}
		if x.all[mac] != nil || taken[mac] {
			return false
		}
		a.MAC, taken[mac] = mac, true
	}
	before := len(x.r.ds)
	for _, f := range files {
		for _, vm := range f.VMs {
			x.r.vm(vm)
		}
	}
	if len(x.r.ds) != before {
		return false
	}
	for _, a := range entries {
		x.all[a.MAC] = a
	}
	x.spent = false
	return true
}

// Remove takes files, which x resolved, out of it. What the others took
// stays theirs; whether their MACs are still ResolveKeeping's is Stable's
// to say.
func (x *Resolution) Remove(files []*VMFile) bool {
	if x.spent {
		return false
	}
	r := x.r
	for _, f := range files {
		entries, ok := x.files[f]
		if !ok {
			x.spent = true
			return false
		}
		delete(x.files, f)
		for _, a := range entries {
			if x.all[a.MAC] == a {
				delete(x.all, a.MAC)
			}
		}
		managed := map[*Attachment]bool{} // the entries vm counted
		for _, vm := range f.VMs {
			if name := strings.ToLower(vm.Name); r.vms[name] == vm {
				delete(r.vms, name)
			}
			for _, a := range vm.Attachments {
				managed[a] = true
				if r.macs[a.MAC] == a {
					delete(r.macs, a.MAC)
				}
				if a.IP.IsValid() {
					if k := (netIP{a.Network, a.IP}); r.ips[k] == a {
						delete(r.ips, k)
					}
				}
				r.total--
				if n := r.nets.Get(a.Network); n != nil && n.Routed() {
					r.ports[a.Network]--
				}
			}
		}
		r.forwards = slices.DeleteFunc(r.forwards, func(f ownedForward) bool { return managed[f.of] })
	}
	return true
}

// Stable reports whether each entry x holds has the MAC ResolveKeeping
// with keep would give it: one set in its file, the one keep gives it, or
// its first with none kept. (An entry that took a later one, its first
// taken, would take its first again once the other went.)
func (x *Resolution) Stable(keep map[string]string) bool {
	if x.spent {
		return false
	}
	for mac, a := range x.all {
		if !a.MACDerived {
			continue
		}
		if kept, ok := keep[a.Key()]; ok {
			if kept == mac {
				continue
			}
			if a.derivedFor(kept) {
				return false // (ResolveKeeping would give it kept, or settle who has it)
			}
			// Not one of its own (a helper that runs with a MAC set
			// before, or run's): ResolveKeeping gives it its first.
		}
		if first, _ := a.derivedMACs(); first != mac {
			return false
		}
	}
	return true
}
