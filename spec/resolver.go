package spec

import (
	"slices"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// Resolver is the controller's desired state kept between its passes: a
// pass that adds or removes a project (an attach or a detach through the
// projects' API: a project a VM) resolves that project's files alone
// against what the others took (api.Resolution), where resolving every
// project's clone on every pass grew with the fleet. Whenever the
// projects' changes cannot be resolved alone (something they share with
// another, a MAC that is not settled, the networks changed, a network
// made on demand), it resolves them all, as ComputeParsed does; either
// way the Desired is the one ComputeParsed gives. Not safe for
// concurrent use.
type Resolver struct {
	cache       ParseCache
	nets        *api.Networks
	res         *api.Resolution // nil: resolve all next time
	projects    map[string]*resolvedProject
	attachments []*Attachment  // the last Desired's, sorted
	uses        map[string]int // its attachments by network

	// Incremental and Full count the passes resolved each way (for
	// tests and benchmarks).
	Incremental, Full int
}

// resolvedProject is what a project's files resolved to.
type resolvedProject struct {
	entry    *parsedEntry // the parse its files are clones of
	external bool
	files    []*api.VMFile
	atts     []*Attachment
	skipped  []string
}

// collect sets rp's attachments (of, for each entry of its resolved
// files) and the lines of the entries it leaves to others.
func (rp *resolvedProject) collect(of func(*api.Attachment) *Attachment) {
	for _, f := range rp.files {
		for _, vm := range f.VMs {
			for _, a := range vm.Attachments {
				rp.atts = append(rp.atts, of(a))
			}
			for _, s := range vm.Skipped {
				rp.skipped = append(rp.skipped, skippedLine(vm, s))
			}
		}
	}
}

// Peek is projects parsed, from the Resolver's cache where it can,
// without changing it (ParseCache.Peek): for a check of projects that
// are not the desired state.
func (rv *Resolver) Peek(projects []*statedir.Project) ([]ParsedProject, api.Diagnostics) {
	return rv.cache.Peek(projects)
}

// Parsed reports whether project name is in the Resolver's parse cache.
func (rv *Resolver) Parsed(name string) bool {
	_, ok := rv.cache[name]
	return ok
}

// Resolve is the desired state of projects on nets, the attachments that
// run keeping their MACs (keep, by attachment key): ComputeParsed's.
func (rv *Resolver) Resolve(nets *api.Networks, projects []*statedir.Project, keep map[string]string) (*Desired, error) {
	if d := rv.changed(nets, projects, keep); d != nil {
		rv.Incremental++
		return d, nil
	}
	rv.Full++
	return rv.all(nets, projects, keep)
}

// all resolves every project, and keeps what they resolved to when it can.
func (rv *Resolver) all(nets *api.Networks, projects []*statedir.Project, keep map[string]string) (*Desired, error) {
	rv.res, rv.projects, rv.attachments, rv.uses = nil, nil, nil, nil
	parsed, diags := rv.cache.Parse(projects)
	d, res, rdiags := resolve(nets, parsed, keep, !diags.HasErrors())
	if err := append(diags, rdiags...).Err(); err != nil {
		return nil, err
	}
	if res == nil {
		return d, nil
	}
	of := make(map[*api.Attachment]*Attachment, len(d.Attachments))
	for _, a := range d.Attachments {
		of[a.Attachment] = a
	}
	rv.projects = make(map[string]*resolvedProject, len(projects))
	for _, pp := range parsed {
		rp := &resolvedProject{entry: rv.cache[pp.Name], external: pp.External, files: pp.Files}
		rp.collect(func(a *api.Attachment) *Attachment { return of[a] })
		rv.projects[pp.Name] = rp
	}
	rv.nets, rv.res = nets, res
	rv.attachments = slices.Clone(d.Attachments)
	rv.uses = map[string]int{}
	for _, a := range d.Attachments {
		rv.uses[a.Network]++
	}
	return d, nil
}

// changed is the desired state resolved from the projects that changed
// since the last pass alone, or nil where it cannot be: resolve them all.
func (rv *Resolver) changed(nets *api.Networks, projects []*statedir.Project, keep map[string]string) *Desired {
	if rv.res == nil || nets != rv.nets {
		return nil
	}
	d, ok := rv.apply(nets, projects, keep)
	if !ok {
		rv.res = nil // (spent: resolve all next time)
		return nil
	}
	return d
}

func (rv *Resolver) apply(nets *api.Networks, projects []*statedir.Project, keep map[string]string) (*Desired, bool) {
	var added []*statedir.Project
	var entries []*parsedEntry
	same := 0
	for _, p := range projects {
		rp := rv.projects[p.Name]
		if rp != nil && rp.entry.src == p && rp.external == p.External {
			// The record the last pass read (statedir.ProjectReader gives
			// it again while its file is unchanged).
			same++
			continue
		}
		if p.OnDemand != nil {
			return nil, false
		}
		e := rv.cache.entry(p, true)
		if e.diags.HasErrors() {
			return nil, false
		}
		if rp != nil && rp.entry == e && rp.external == p.External {
			same++
			continue
		}
		added, entries = append(added, p), append(entries, e)
	}
	// The projects that went or changed: those not the same, since each
	// project of the pass is one name. Those that went leave the parse
	// cache too.
	var gone []string
	if same != len(rv.projects) {
		now := make(map[string]bool, len(projects))
		for _, p := range projects {
			now[p.Name] = true
		}
		for name := range rv.projects {
			if !now[name] {
				gone = append(gone, name)
				delete(rv.cache, name)
			}
		}
	}
	for _, p := range added {
		if rv.projects[p.Name] != nil {
			gone = append(gone, p.Name)
		}
	}
	out := make(map[string]bool, len(gone))
	for _, name := range gone {
		rp := rv.projects[name]
		if !rv.res.Remove(rp.files) {
			return nil, false
		}
		for _, a := range rp.atts {
			rv.uses[a.Network]--
		}
		out[name] = true
		delete(rv.projects, name)
	}
	var in []*Attachment
	for i, p := range added {
		rp := &resolvedProject{entry: entries[i], external: p.External}
		for _, f := range entries[i].Files {
			rp.files = append(rp.files, f.Clone())
		}
		if !rv.res.Add(rp.files, keep) {
			return nil, false
		}
		rp.collect(func(a *api.Attachment) *Attachment {
			return &Attachment{Attachment: a, Project: p.Name, External: p.External}
		})
		for _, a := range rp.atts {
			rv.uses[a.Network]++
		}
		in = append(in, rp.atts...)
		rv.projects[p.Name] = rp
	}
	if !rv.res.Stable(keep) {
		return nil, false
	}
	used := map[string]bool{}
	for _, p := range projects {
		for _, id := range p.Networks {
			if nets.Get(id) == nil {
				return nil, false // (an error: resolving all says it)
			}
			used[id] = true
		}
	}
	// The last Desired's attachments, those of the projects gone out and
	// those that came in, in order.
	atts := slices.Clone(rv.attachments)
	if len(out) > 0 {
		atts = slices.DeleteFunc(atts, func(a *Attachment) bool { return out[a.Project] })
	}
	for _, a := range in {
		i, _ := slices.BinarySearchFunc(atts, a, compareAttachments)
		atts = slices.Insert(atts, i, a)
	}
	if len(atts) == 0 {
		atts = nil // (as ComputeParsed gives none)
	}
	rv.attachments = atts
	d := &Desired{Attachments: slices.Clone(atts)}
	for _, n := range nets.Networks {
		if used[n.ID] || rv.uses[n.ID] > 0 {
			d.Networks = append(d.Networks, n)
		}
	}
	for _, p := range projects {
		d.Skipped = append(d.Skipped, rv.projects[p.Name].skipped...)
	}
	return d, true
}
