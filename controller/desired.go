package controller

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// Attachment is an attachment that belongs to a project.
type Attachment struct {
	*api.Attachment
	Project string `json:"project"`
	// External is set for attachments whose helper `vmnetctl run` owns.
	External bool `json:"external,omitempty"`
}

// Desired is everything that should run: the networks some attachment uses,
// and every attachment of every project.
type Desired struct {
	Networks    []*api.Network `json:"networks"`
	Attachments []*Attachment  `json:"attachments"`
	// Skipped lists entries vmnetctl leaves to others, for display.
	Skipped []string `json:"skipped,omitempty"`
}

// Network returns the desired network with the given ID, or nil.
func (d *Desired) Network(id string) *api.Network {
	for _, n := range d.Networks {
		if n.ID == id {
			return n
		}
	}
	return nil
}

// ComputeDesired resolves every project against nets. It fails, with every
// problem listed, when a file no longer validates or two projects define the
// same VM.
func ComputeDesired(nets *api.Networks, projects []*statedir.Project) (*Desired, error) {
	var all api.Diagnostics
	var files []*api.VMFile
	owner := map[*api.VMFile]*statedir.Project{}
	for _, p := range projects {
		for _, f := range p.Files {
			vf, diags := api.LoadVMFile(f.Path, f.Data, api.VMFileOptions{Name: p.VMName})
			all = append(all, diags...)
			if vf != nil {
				if len(p.OnlyVMs) > 0 {
					vf.VMs = slices.DeleteFunc(vf.VMs, func(vm *api.VM) bool { return !slices.Contains(p.OnlyVMs, vm.Name) })
				}
				files = append(files, vf)
				owner[vf] = p
			}
		}
	}
	// One Resolve over all projects finds VMs, MACs and addresses that
	// collide across projects too.
	all = append(all, api.Resolve(nets, files)...)
	if err := all.Err(); err != nil {
		return nil, err
	}
	d := &Desired{}
	used := map[string]bool{}
	for _, vf := range files {
		for _, vm := range vf.VMs {
			for _, a := range vm.Attachments {
				d.Attachments = append(d.Attachments, &Attachment{Attachment: a, Project: owner[vf].Name, External: owner[vf].External})
				used[a.Network] = true
			}
			for _, s := range vm.Skipped {
				d.Skipped = append(d.Skipped, fmt.Sprintf("%s: entry %d (%s): %s", vm.Name, s.Index, s.Entry, s.Reason))
			}
		}
	}
	for _, n := range nets.Networks {
		if used[n.ID] {
			d.Networks = append(d.Networks, n)
		}
	}
	slices.SortFunc(d.Attachments, func(a, b *Attachment) int {
		return cmp.Or(cmp.Compare(a.VM, b.VM), cmp.Compare(a.Index, b.Index))
	})
	return d, nil
}
