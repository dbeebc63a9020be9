package statedir

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/dirwatch"
	"github.com/vmnetctl/vmnetctl/procid"
)

// Project is one `up -f FILE...`: the VM files it was given, as they were.
// vmnetctl keeps the files' bytes, not a derived form, so that the desired
// state is always recomputed by the same parser that validated it.
type Project struct {
	Name  string        `json:"name"`
	Files []ProjectFile `json:"files"`
	// VMName is --name, for lima instance files.
	VMName string `json:"vmName,omitempty"`
	// UID and GID own the project's helpers and sockets: the user who ran
	// `up` ($SUDO_UID and $SUDO_GID under sudo).
	UID int `json:"uid"`
	GID int `json:"gid"`
	// OnlyVMs limits the project to these VMs of its files (for `run --vm`).
	OnlyVMs []string `json:"onlyVMs,omitempty"`
	// External projects belong to `vmnetctl run`: the controller keeps their
	// networks, addresses and names, but their helpers are run's, started
	// on socketpairs; the controller adopts them to watch, never restarts them.
	External bool `json:"external,omitempty"`
	// Networks are kept up whether VMs use them or not (`vmnetctl network
	// create`): such a project has no files.
	Networks []string `json:"networks,omitempty"`
	// Holder, if set, is the process the project lives for: a `vmnetctl
	// helper` started on a network that was not up holds it up this way,
	// and the controller drops the project once the process is gone.
	Holder *procid.Identity `json:"holder,omitempty"`
	// OnDemand is the definition (networks.yaml text) of a network made on
	// demand that the project holds up (api.OnDemandNetwork).
	OnDemand []byte `json:"onDemand,omitempty"`
}

// HolderProjectPrefix starts the name of a project a process holds
// (Project.Holder): "hold.PID".
const HolderProjectPrefix = "hold."

// NetworkProjectPrefix starts the name of the project that keeps a network
// up on its own (`vmnetctl network create NAME`: project "network.NAME").
const NetworkProjectPrefix = "network."

// ProjectFile is one VM file of a project.
type ProjectFile struct {
	Path string `json:"path"`
	Data []byte `json:"data"`
	// Abs is the file's absolute path when it was read (none in an older
	// vmnetctl's record): another file of the same name, elsewhere, is
	// told apart by it.
	Abs string `json:"abs,omitempty"`
}

// NetworksSnapshot is the networks.yaml the desired state was resolved against.
type NetworksSnapshot struct {
	Source string `json:"source"`
	Data   []byte `json:"data"`
	// Abs is the file's absolute path when it was read from a file (none
	// for the embedded defaults, or in an older vmnetctl's record): a
	// reload reads it again there.
	Abs string `json:"abs,omitempty"`
}

// Same reports whether n (nil for none) is the networks.yaml o: the same
// source and text (where it was read from aside).
func (n *NetworksSnapshot) Same(o NetworksSnapshot) bool {
	return n != nil && n.Source == o.Source && bytes.Equal(n.Data, o.Data)
}

// Load parses the snapshot.
func (n *NetworksSnapshot) Load() (*api.Networks, error) {
	nets, diags := api.LoadNetworks(n.Source, n.Data)
	return nets, diags.Err()
}

// SaveNetworks records the networks.yaml that `up` used.
func (d Dir) SaveNetworks(snap NetworksSnapshot) error {
	if rec, err := d.Networks(); err == nil && rec.Same(snap) && rec.Abs == snap.Abs {
		// The networks of record: an `up` of one VM more writes (and
		// syncs) nothing here.
		return d.EnsureNetworksYAML(&snap)
	}
	if err := d.writeFile(networksYAMLFile, snap.Data); err != nil {
		return err
	}
	// Helpers run through sudo read it only if their user may (it holds
	// no secrets): readable by all.
	if err := os.Chmod(d.NetworksYAML(), 0o644); err != nil {
		return err
	}
	return d.writeJSON(networksSnapshotFile, snap)
}

// EnsureNetworksYAML writes the helpers' copy of snap (NetworksYAML) if it
// is missing or differs: a state dir under /run loses it at a reboot, and
// snap is kept (KeepDir).
func (d Dir) EnsureNetworksYAML(snap *NetworksSnapshot) error {
	if have, err := readNoFollow(d.NetworksYAML()); err == nil && bytes.Equal(have, snap.Data) {
		// Readable by all, whatever a crash between its write and its
		// chmod, or an older vmnetctl, left.
		if fi, err := os.Lstat(d.NetworksYAML()); err == nil && fi.Mode().Perm() != 0o644 {
			return os.Chmod(d.NetworksYAML(), 0o644)
		}
		return nil
	}
	if err := d.writeFile(networksYAMLFile, snap.Data); err != nil {
		return err
	}
	return os.Chmod(d.NetworksYAML(), 0o644)
}

// Networks returns the recorded networks.yaml, or nil when none was recorded.
func (d Dir) Networks() (*NetworksSnapshot, error) {
	var snap NetworksSnapshot
	found, err := d.readJSON(networksSnapshotFile, &snap)
	if err != nil || !found {
		return nil, err
	}
	return &snap, nil
}

// SaveProjectAndNetworks records p and the networks.yaml it was resolved
// against (SaveNetworks, SaveProject) under the lock that
// RemoveRuntimeIfNoProjects takes, so that a controller tearing down for
// want of projects never removes them.
func (d Dir) SaveProjectAndNetworks(snap NetworksSnapshot, p *Project) error {
	l, err := d.lockProjects()
	if err != nil {
		return err
	}
	defer l.Unlock()
	if err := d.SaveNetworks(snap); err != nil {
		return err
	}
	return d.SaveProject(p)
}

// SaveProject adds or replaces a project.
func (d Dir) SaveProject(p *Project) error {
	if msg := checkProjectName(p.Name); msg != "" {
		return errors.New(msg)
	}
	return d.writeJSON(projectFile(p.Name), p)
}

// DeleteProjectHeldBy removes project name if holder still holds it, under
// the lock SaveProjectAndNetworks takes: a process that saved a project of
// the same name since (a `vmnetctl run` started again) keeps it.
func (d Dir) DeleteProjectHeldBy(name string, holder procid.Identity) (bool, error) {
	l, err := d.lockProjects()
	if err != nil {
		return false, err
	}
	defer l.Unlock()
	p, err := d.Project(name)
	if err != nil || p == nil || p.Holder == nil || p.Holder.PID != holder.PID || p.Holder.StartTime != holder.StartTime {
		return false, err
	}
	return d.DeleteProject(name)
}

// DeleteProject removes a project; removing one that does not exist is fine.
func (d Dir) DeleteProject(name string) (existed bool, err error) {
	if err := CheckProjectName(name); err != nil {
		return false, err // (a name of "../x" is a file elsewhere)
	}
	err = os.Remove(d.file(projectFile(name)))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// Project returns the project of that name, or nil if none is recorded:
// one record read, where Projects reads them all.
func (d Dir) Project(name string) (*Project, error) {
	if msg := checkProjectName(name); msg != "" {
		return nil, errors.New(msg)
	}
	p := &Project{}
	found, err := d.readJSON(projectFile(name), p)
	if err != nil || !found {
		return nil, err
	}
	return p, nil
}

// projectFile is the record of project name.
func projectFile(name string) string { return filepath.Join(projectsDir, name+".json") }

// Projects returns every project, by name.
func (d Dir) Projects() ([]*Project, error) {
	names, err := d.ProjectNames()
	if err != nil {
		return nil, err
	}
	var out []*Project
	for _, name := range names {
		p := &Project{}
		if _, err := d.readJSON(projectFile(name), p); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b *Project) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// ProjectReader reads the projects as Projects does, and decodes a
// project's record again only when its file changed since it last read it
// (another inode, size or modification time: a record is replaced by a
// rename): a controller's pass beside a fleet of thousands of VMs in one
// project does not decode its record every time. It learns which records
// changed from a watch of their folder (dirwatch) and looks at those
// alone: beside 1,000 projects of one VM, listing the folder and a stat of
// every record took 4 to 7 ms of each pass and each check. The projects it
// returns are shared from one call to the next: callers must not change
// them (the slice is theirs). Safe for concurrent use.
type ProjectReader struct {
	mu   sync.Mutex
	read map[string]readProject // by project name; nil: not read yet
	out  []*Project             // read's projects by name; nil: to sort again
	// dir is the projects' folder that watch watches; closed: watch no
	// more (Close).
	dir    string
	watch  *dirwatch.Watch
	closed bool
}

// readProject is a project as read, and its file then.
type readProject struct {
	fi fs.FileInfo
	p  *Project
}

// same reports whether file fi is the one read (the same inode, size and
// modification time).
func (r readProject) same(fi fs.FileInfo) bool {
	return os.SameFile(r.fi, fi) && r.fi.Size() == fi.Size() && r.fi.ModTime().Equal(fi.ModTime())
}

// Projects returns every project of d, by name; a record removed since
// the folder was listed is left out.
func (r *ProjectReader) Projects(d Dir) ([]*Project, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if dir := d.file(projectsDir); !r.closed && (r.watch == nil || r.dir != dir) {
		r.watch.Close()
		r.watch, r.dir, r.read, r.out = dirwatch.New(dir), dir, nil, nil
	}
	// Drained before the records are looked at: a record written while
	// they are is named again next time.
	r.watch.Drain()
	var err error
	if r.watch.Tells() && r.read != nil {
		err = r.readNamed(d)
	} else {
		err = r.readAll(d)
	}
	if err != nil {
		r.watch.Unknown() // every record looked at again next time
		return nil, err
	}
	r.watch.Take()
	if r.out == nil {
		for _, rp := range r.read {
			r.out = append(r.out, rp.p)
		}
		slices.SortFunc(r.out, func(a, b *Project) int { return strings.Compare(a.Name, b.Name) })
	}
	// The slice is the caller's (the controller drops from it the
	// projects whose holder is gone); the projects are shared.
	return slices.Clone(r.out), nil
}

// Close stops watching the projects' folder: a later call (a check the
// controller's server still ran as it stopped) looks at every record.
func (r *ProjectReader) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.watch.Close()
	r.watch, r.read, r.out, r.closed = nil, nil, nil, true
}

// readAll looks at every record of the folder.
func (r *ProjectReader) readAll(d Dir) error {
	names, err := d.ProjectNames()
	if err != nil {
		return err
	}
	was := r.read
	r.read, r.out = make(map[string]readProject, len(names)), nil
	for _, name := range names {
		if err := r.look(d, name, was); err != nil {
			return err
		}
	}
	return nil
}

// readNamed looks at the records the watch named since the last look.
func (r *ProjectReader) readNamed(d Dir) error {
	for file := range r.watch.Names() {
		name, ok := strings.CutSuffix(file, ".json")
		if !ok {
			continue // (an atomic write's temporary file: as jsonNames)
		}
		if err := r.look(d, name, r.read); err != nil {
			return err
		}
	}
	return nil
}

// look reads project name's record into r.read, unless was has it as its
// file is now; it drops the project if its record is gone.
func (r *ProjectReader) look(d Dir, name string, was map[string]readProject) error {
	rel := projectFile(name)
	fi, err := os.Lstat(d.file(rel))
	switch {
	case errors.Is(err, fs.ErrNotExist) || err == nil && fi.IsDir():
		if _, ok := r.read[name]; ok {
			delete(r.read, name)
			r.out = nil
		}
		return nil
	case err != nil:
		return fmt.Errorf("reading state: %w", err)
	}
	if rp, ok := was[name]; ok && rp.same(fi) {
		r.read[name] = rp
		return nil
	}
	// Read after the stat: a record replaced in between is newer than
	// what is remembered of it, and read again next time.
	p := &Project{}
	found, err := d.readJSON(rel, p)
	if err != nil {
		return err
	}
	r.out = nil
	if !found {
		delete(r.read, name)
		return nil
	}
	r.read[name] = readProject{fi: fi, p: p}
	return nil
}

// ProjectNames are the names of the projects recorded, from their files'
// names alone: a record that cannot be read (truncated, garbage) is still
// one, and `down --all` removes it with the others.
func (d Dir) ProjectNames() ([]string, error) {
	names, err := d.jsonNames(projectsDir)
	if err != nil {
		return nil, fmt.Errorf("reading projects: %w", err)
	}
	return names, nil
}

// jsonNames are the names, without ".json", of the records in folder dir
// of the state dir (an atomic write's temporary file is not one); none
// without the folder.
func (d Dir) jsonNames(dir string) ([]string, error) {
	entries, err := os.ReadDir(d.file(dir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if name, ok := strings.CutSuffix(e.Name(), ".json"); ok && !e.IsDir() {
			names = append(names, name)
		}
	}
	return names, nil
}

// CheckProjectName says why name cannot name a project (nil if it can).
func CheckProjectName(name string) error {
	if msg := checkProjectName(name); msg != "" {
		return errors.New(msg)
	}
	return nil
}

// checkProjectName returns why name cannot name a project, or "".
func checkProjectName(name string) string {
	// Valid UTF-8 without control characters too: the name is a metric
	// label and is printed to terminals.
	if name == "" || strings.ContainsAny(name, "/\\\x00") || name[0] == '.' || name[0] == '-' || len(name) > 63 ||
		!utf8.ValidString(name) || strings.ContainsFunc(name, unicode.IsControl) {
		return fmt.Sprintf("project name %q: use letters, digits, '-', '_' and '.', not starting with '.' or '-'", name)
	}
	return ""
}

// maxSocketPath is the longest path a unix socket can bind (sun_path, less
// its terminating NUL).
const maxSocketPath = 107

// CheckSocketPaths refuses VMs whose helper sockets in d would not fit a
// unix socket path: bind would fail at `up`, after the networks came up.
func (d Dir) CheckSocketPaths(files []*api.VMFile) error {
	var errs api.Diagnostics // validate's errors, counted as they are
	for _, vf := range files {
		for _, vm := range vf.VMs {
			for _, a := range vm.Attachments {
				if a.Attach == api.AttachTAP {
					continue
				}
				if p := d.SocketPath(vm.Name, a.Index); len(p) > maxSocketPath {
					errs = append(errs, api.Diagnostic{File: vm.Source.File, Line: vm.Source.Line, Severity: api.SeverityError,
						Message: fmt.Sprintf("VM %s: its helper's socket %s is %d bytes, over the %d a unix socket path can hold: use a shorter --state-dir or VM name",
							vm.Name, p, len(p), maxSocketPath)})
				}
			}
		}
	}
	return errs.Err()
}

// NameTaken refuses to record project p (of VM files, as `up` records
// one) in place of the project of its name, q (nil if none): when q is
// one vmnetctl keeps for itself (a network's, a `vmnetctl run`'s, a
// process's), or when p's name came from its first file's (no -p:
// nameGiven false) and q holds another file of the same name, elsewhere.
// Either way recording p would replace q, its VMs or networks taken
// down, without a word.
func NameTaken(p, q *Project, nameGiven bool) error {
	if q != nil && (q.Holder != nil || q.External || len(q.Networks) > 0) {
		return fmt.Errorf("project %q is vmnetctl's own (it keeps a network up, or a `vmnetctl run` or another process holds it): give this one another name with -p NAME", q.Name)
	}
	if nameGiven || len(p.Files) == 0 || p.Files[0].Abs == "" {
		return nil
	}
	if q != nil && q.Name == p.Name && len(q.Files) > 0 && q.Files[0].Abs != "" && q.Files[0].Abs != p.Files[0].Abs {
		return fmt.Errorf("project %q, named after %s, is already %s's; up would replace it and take its VMs down: give this one a name of its own with -p NAME (or take the other down first: vmnetctl down -p %s)",
			p.Name, p.Files[0].Path, q.Files[0].Abs, q.Name)
	}
	return nil
}

// ProjectName is the default project name for VM files: the VM's name for a
// single lima instance file, else the first file's base name without extension.
func ProjectName(files []*api.VMFile) string {
	if len(files) == 0 {
		return ""
	}
	if len(files) == 1 && files[0].Shape == api.ShapeLima && len(files[0].VMs) == 1 {
		return files[0].VMs[0].Name
	}
	base := filepath.Base(files[0].File)
	return strings.TrimSuffix(base, filepath.Ext(base))
}

// NetworkMadeOnDemand returns the network made on demand with this id that
// a project of the state dir holds up (a helper started with vmnet-helper's
// address flags), for `vmnetctl helper --network ID`: as on macOS, where
// vmnet-broker lets a second VM join a network by name. Nil if none.
func (d Dir) NetworkMadeOnDemand(id string) (*api.Network, error) {
	projects, err := d.Projects()
	if err != nil {
		return nil, err
	}
	for _, p := range projects {
		if p.OnDemand == nil {
			continue
		}
		od, diags := api.LoadNetworks(api.OnDemandSource, p.OnDemand)
		if diags.HasErrors() {
			continue
		}
		if n := od.Get(id); n != nil {
			n.OnDemand = p.OnDemand
			return n, nil
		}
	}
	return nil, nil
}
