package spec

import (
	"cmp"
	"crypto/sha256"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"

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

// ParsedProject is a project with its VM files parsed, not yet resolved.
type ParsedProject struct {
	*statedir.Project
	Files []*api.VMFile
}

// ParseProject parses a project's files, keeping only its OnlyVMs if set;
// each file is named by its path as given (this command's input).
func ParseProject(p *statedir.Project) (ParsedProject, api.Diagnostics) {
	return parseFiles(p, func(f statedir.ProjectFile) string { return f.Path })
}

// parseRecorded is ParseProject of a project the state dir recorded: a
// file given by a relative path is named by its absolute one, since who
// reads a problem of it (another project's `up`, the controller's status)
// is not in the directory that path was relative to.
func parseRecorded(p *statedir.Project) (ParsedProject, api.Diagnostics) {
	return parseFiles(p, func(f statedir.ProjectFile) string {
		if !filepath.IsAbs(f.Path) && f.Abs != "" {
			return f.Abs
		}
		return f.Path
	})
}

// parseFiles is ParseProject with each file named by name.
func parseFiles(p *statedir.Project, name func(statedir.ProjectFile) string) (ParsedProject, api.Diagnostics) {
	pp := ParsedProject{Project: p}
	var all api.Diagnostics
	for _, f := range p.Files {
		vf, diags := api.LoadVMFile(name(f), f.Data, api.VMFileOptions{Name: p.VMName, Abs: f.Abs})
		all = append(all, diags...)
		if vf != nil {
			pp.Files = append(pp.Files, vf)
		}
	}
	pp.KeepOnly(p.OnlyVMs)
	return pp, all
}

// keepOnly drops the VMs not named in vms, unless vms is empty.
func (pp ParsedProject) KeepOnly(vms []string) {
	if len(vms) == 0 {
		return
	}
	for _, vf := range pp.Files {
		vf.VMs = slices.DeleteFunc(vf.VMs, func(vm *api.VM) bool { return !slices.Contains(vms, vm.Name) })
	}
}

// parseProjects parses the recorded projects' files (parseRecorded).
func ParseProjects(projects []*statedir.Project) ([]ParsedProject, api.Diagnostics) {
	var out []ParsedProject
	var all api.Diagnostics
	for _, p := range projects {
		pp, diags := parseRecorded(p)
		out = append(out, pp)
		all = append(all, diags...)
	}
	return out, all
}

// ComputeDesired resolves every project against nets. It fails, with every
// problem listed, when a file no longer validates or two projects define the
// same VM.
//
// keep is the MACs the attachments that run have (by attachment key,
// KeptMACs): those vmnetctl derived are kept (api.ResolveKeeping).
func ComputeDesired(nets *api.Networks, projects []*statedir.Project, keep map[string]string) (*Desired, error) {
	parsed, diags := ParseProjects(projects)
	return ComputeParsed(nets, parsed, diags, keep)
}

// ComputeParsed is ComputeDesired of projects parsed already, with the
// diagnostics of their parsing.
func ComputeParsed(nets *api.Networks, parsed []ParsedProject, diags api.Diagnostics, keep map[string]string) (*Desired, error) {
	d, rdiags := Resolve(nets, parsed, keep)
	if err := append(diags, rdiags...).Err(); err != nil {
		return nil, err
	}
	return d, nil
}

// withOnDemand returns nets with the networks made on demand that projects
// hold (helpers started with vmnet-helper's address flags): the same flags
// give the same network, so one id is defined once; a network of
// networks.yaml keeps its id.
func withOnDemand(nets *api.Networks, projects []ParsedProject) (*api.Networks, api.Diagnostics) {
	var diags api.Diagnostics
	out := nets
	for _, p := range projects {
		if p.OnDemand == nil {
			continue
		}
		od, d := api.LoadNetworks(api.OnDemandSource, p.OnDemand)
		if d.HasErrors() {
			diags = append(diags, d...)
			continue
		}
		for _, n := range od.Networks {
			if out.Get(n.ID) != nil {
				continue
			}
			if out == nets {
				cp := *nets
				cp.Networks = slices.Clone(nets.Networks)
				out = &cp
			}
			n.OnDemand = p.OnDemand
			out.Networks = append(out.Networks, n)
		}
	}
	return out, diags
}

// nameProjects adds to each "also defined at FILE:LINE" diagnostic
// between two projects the projects and how to free the name: the user
// sees which `up` brought the other definition in.
func nameProjects(diags api.Diagnostics, owner map[*api.VMFile]*statedir.Project) {
	projectOf := func(file string) string {
		for vf, p := range owner {
			if vf.File == file {
				return p.Name
			}
		}
		return ""
	}
	for i := range diags {
		d := &diags[i]
		_, at, ok := strings.Cut(d.Message, "also defined at ")
		if !ok {
			continue
		}
		file, _, _ := strings.Cut(at, ":")
		here, there := projectOf(d.File), projectOf(file)
		if here != "" && there != "" && here != there {
			d.Message += fmt.Sprintf(" (projects %s and %s: `vmnetctl down -p` one of them first, or rename the VM)", here, there)
		}
	}
}

// Resolve resolves parsed projects against nets, all at once: one Resolve
// over all projects finds VMs, MACs and addresses that collide across
// projects too. d is nil when the diagnostics have errors.
func Resolve(nets *api.Networks, projects []ParsedProject, keep map[string]string) (*Desired, api.Diagnostics) {
	d, _, diags := resolve(nets, projects, keep, false)
	return d, diags
}

// resolve is Resolve, with the files' api.Resolution if asked for (kept)
// and there is one: no diagnostics, no network made on demand.
func resolve(nets *api.Networks, projects []ParsedProject, keep map[string]string, kept bool) (*Desired, *api.Resolution, api.Diagnostics) {
	n := 0
	for _, p := range projects {
		n += len(p.Files)
	}
	// Each file's project: owners[i] is files[i]'s.
	files, owners := make([]*api.VMFile, 0, n), make([]*statedir.Project, 0, n)
	for _, p := range projects {
		for _, vf := range p.Files {
			files = append(files, vf)
			owners = append(owners, p.Project)
		}
	}
	withOD, odiags := withOnDemand(nets, projects)
	if odiags.HasErrors() {
		return nil, nil, odiags
	}
	var res *api.Resolution
	var diags api.Diagnostics
	if kept && withOD == nets {
		res, diags = api.ResolveAll(nets, files, keep)
	} else {
		diags = api.ResolveKeeping(withOD, files, keep)
	}
	nets = withOD
	if len(diags) > 0 {
		owner := make(map[*api.VMFile]*statedir.Project, len(files))
		for i, vf := range files {
			owner[vf] = owners[i]
		}
		nameProjects(diags, owner)
	}
	if diags.HasErrors() {
		return nil, nil, diags
	}
	d := &Desired{}
	used := map[string]bool{}
	for i, vf := range files {
		for _, vm := range vf.VMs {
			for _, a := range vm.Attachments {
				d.Attachments = append(d.Attachments, &Attachment{Attachment: a, Project: owners[i].Name, External: owners[i].External})
				used[a.Network] = true
			}
			for _, s := range vm.Skipped {
				d.Skipped = append(d.Skipped, skippedLine(vm, s))
			}
		}
	}
	for _, p := range projects {
		for _, id := range p.Networks {
			if nets.Get(id) == nil {
				diags = append(diags, api.Diagnostic{Severity: api.SeverityError, File: "project " + p.Name,
					Message: fmt.Sprintf("network %q (kept up by `vmnetctl network create`) is not defined in %s", id, nets.Source)})
				continue
			}
			used[id] = true
		}
	}
	if diags.HasErrors() {
		return nil, nil, diags
	}
	for _, n := range nets.Networks {
		if used[n.ID] {
			d.Networks = append(d.Networks, n)
		}
	}
	slices.SortFunc(d.Attachments, compareAttachments)
	return d, res, diags
}

// compareAttachments orders a Desired's attachments: by VM, then entry.
func compareAttachments(a, b *Attachment) int {
	return cmp.Or(cmp.Compare(a.VM, b.VM), cmp.Compare(a.Index, b.Index))
}

// skippedLine is how a Desired lists an entry vmnetctl leaves to others.
func skippedLine(vm *api.VM, s api.Skipped) string {
	return fmt.Sprintf("%s: entry %d (%s): %s", vm.Name, s.Index, s.Entry, s.Reason)
}

// KeptMACs is the MACs of the helpers recs records, by attachment key: an
// attachment keeps the MAC it runs with (ComputeDesired).
func KeptMACs(recs []statedir.HelperRecord) map[string]string {
	keep := make(map[string]string, len(recs))
	for i := range recs {
		KeepMAC(keep, &recs[i])
	}
	return keep
}

// KeepMAC adds the MAC that helper r runs with to keep (KeptMACs).
func KeepMAC(keep map[string]string, r *statedir.HelperRecord) {
	if r.MAC != "" {
		keep[r.Key] = r.MAC
	}
}

// ofProject is d with only project's attachments, and the networks they
// use or the project keeps up (of projects, its record).
func (d *Desired) OfProject(project string, projects []*statedir.Project) *Desired {
	out := &Desired{Skipped: d.Skipped}
	used := map[string]bool{}
	for _, a := range d.Attachments {
		if a.Project == project {
			out.Attachments = append(out.Attachments, a)
			used[a.Network] = true
		}
	}
	for _, p := range projects {
		if p.Name == project {
			for _, id := range p.Networks {
				used[id] = true
			}
		}
	}
	for _, n := range d.Networks {
		if used[n.ID] {
			out.Networks = append(out.Networks, n)
		}
	}
	return out
}

// ParseCache keeps each project's parsed files between the controller's
// passes, by project name: a pass parses only the projects whose files
// changed, not a fleet's thousand VMs for one VM's attach. It is changed
// in place, entry by entry (a map made again each pass was a third of
// the desired step with a project a VM).
type ParseCache map[string]*parsedEntry

type parsedEntry struct {
	// src is the project record key was taken of: the one a
	// statedir.ProjectReader gives again while the record is unchanged
	// (and nobody changes), whose key need not be taken again.
	src   *statedir.Project
	key   [sha256.Size]byte
	Files []*api.VMFile
	diags api.Diagnostics
}

// parse is parseProjects, from c where a project's files, VM name and
// VMs are as they were; c then holds these projects only. Resolve writes
// into the files it is given: each pass gets clones.
func (c *ParseCache) Parse(projects []*statedir.Project) ([]ParsedProject, api.Diagnostics) {
	if *c == nil {
		*c = make(ParseCache, len(projects))
	}
	out, diags := c.collect(projects, true)
	c.prune(projects)
	return out, diags
}

// prune drops the projects not among projects.
func (c *ParseCache) prune(projects []*statedir.Project) {
	// The projects' names are their records' file names: one each. A
	// cache of as many entries as projects, each of which it has now,
	// holds nothing else.
	if len(*c) != len(projects) {
		keep := make(map[string]bool, len(projects))
		for _, p := range projects {
			keep[p.Name] = true
		}
		maps.DeleteFunc(*c, func(name string, _ *parsedEntry) bool { return !keep[name] })
	}
}

// peek is parse without changing c: the projects not cached (or changed
// since) are parsed for this call only.
func (c ParseCache) Peek(projects []*statedir.Project) ([]ParsedProject, api.Diagnostics) {
	return c.collect(projects, false)
}

// collect is the projects parsed, from c where it can, each entry also
// stored in c if store.
func (c ParseCache) collect(projects []*statedir.Project, store bool) ([]ParsedProject, api.Diagnostics) {
	out := make([]ParsedProject, 0, len(projects))
	var all api.Diagnostics
	for _, p := range projects {
		e := c.entry(p, store)
		pp := ParsedProject{Project: p, Files: make([]*api.VMFile, len(e.Files))}
		for i, f := range e.Files {
			pp.Files[i] = f.Clone()
		}
		out = append(out, pp)
		all = append(all, e.diags...)
	}
	return out, all
}

// entry is project p parsed, from c where its files are as they were;
// stored in c if store. Its files are c's: clone them to resolve them.
func (c ParseCache) entry(p *statedir.Project, store bool) *parsedEntry {
	e := c[p.Name]
	if e != nil && e.src == p {
		return e
	}
	// (A key of sha256 over the files: 1,000 projects of one VM took a
	// millisecond a pass to hash.)
	k := parseKey(p)
	switch {
	case e == nil || e.key != k:
		pp, diags := parseRecorded(p)
		e = &parsedEntry{key: k, Files: pp.Files, diags: diags}
	case !store:
		e = &parsedEntry{key: e.key, Files: e.Files, diags: e.diags}
	}
	e.src = p
	if store {
		c[p.Name] = e
	}
	return e
}

// parseKey is what a project's parse depends on: its files (where they
// were read too), the VM name and the VMs it keeps.
func parseKey(p *statedir.Project) [sha256.Size]byte {
	h := sha256.New()
	fmt.Fprintf(h, "%q %q\n", p.VMName, p.OnlyVMs)
	for _, f := range p.Files {
		// (Abs too: a file named by a relative path is named by it, and a
		// lima instance's VM by its folder.)
		fmt.Fprintf(h, "%q %q %d\n", f.Path, f.Abs, len(f.Data))
		h.Write(f.Data)
	}
	var k [sha256.Size]byte
	h.Sum(k[:0])
	return k
}
