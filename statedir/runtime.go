package statedir

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/procid"
)

// HelperRecord is what is kept about a running helper, so that a new
// controller can adopt it after a crash.
type HelperRecord struct {
	Key     string          `json:"key"`
	VM      string          `json:"vm"`
	Index   int             `json:"index"`
	Network string          `json:"network"`
	Project string          `json:"project"`
	MAC     string          `json:"mac"`
	Attach  api.AttachKind  `json:"attach"`
	Proc    procid.Identity `json:"proc"`
	Socket  string          `json:"socket,omitempty"`
	Tap     string          `json:"tap,omitempty"`
	// TapIndex is Tap's interface index (the ready line's tap_index), 0
	// if not known (a helper of an older vmnetctl).
	TapIndex  int       `json:"tapIndex,omitempty"`
	Ready     string    `json:"ready"`
	StartedAt time.Time `json:"startedAt"`
	Restarts  int       `json:"restarts"`
}

// Equal reports whether h and o are the same record, field by field
// (TestHelperRecordEqual checks that every field counts).
func (h HelperRecord) Equal(o HelperRecord) bool {
	return h.Key == o.Key && h.VM == o.VM && h.Index == o.Index && h.Network == o.Network && h.Project == o.Project &&
		h.MAC == o.MAC && h.Attach == o.Attach && h.Proc.Equal(o.Proc) && h.Socket == o.Socket && h.Tap == o.Tap && h.TapIndex == o.TapIndex &&
		h.Ready == o.Ready && h.StartedAt.Equal(o.StartedAt) && h.StartedAt.Location() == o.StartedAt.Location() &&
		h.Restarts == o.Restarts
}

// Runtime is what a controller runs and applied: the helpers that run,
// each in a file of its own in the records folder, and what was applied,
// runtime.json and the files of applied/ it names (a runtime.json of an
// older vmnetctl holds them all itself).
type Runtime struct {
	Helpers         []HelperRecord    `json:"helpers"`
	AppliedNetworks *NetworksSnapshot `json:"appliedNetworks,omitempty"`
	AppliedProjects []*Project        `json:"appliedProjects,omitempty"`
}

// SaveRuntime records what the controller runs: compact JSON, since the
// controller writes it on every pass that changed something (indented, a
// fleet's record costs twice the time to write). A controller saves
// through a RuntimeWriter.
func (d Dir) SaveRuntime(rt Runtime) error {
	var w RuntimeWriter
	return w.Save(d, rt)
}

// RuntimeWriter saves the runtime for a controller that saves on every
// pass: it writes nothing when the state is what it wrote last. Each
// helper's record is a file of its own (records/KEY.json), written when
// the record changed and removed when the helper went, so that a pass
// that attaches one VM beside a thousand writes one record, not a
// thousand (runtime.json with every record was 1.3 MB at 1,000 helpers,
// 13 MB at 10,000, written on every pass). Each project as applied is a
// file too (applied/NAME.HASH.json, named by its content and never
// changed), and runtime.json, written last, names them beside the
// networks applied: it is what makes a pass's projects and networks
// applied together, so that a crash in between leaves the last pass's
// whole (beside 1,000 projects of one VM, runtime.json with the projects
// themselves took 2.1 ms a pass to encode and write). What it writes is
// json.Marshal's encoding of each record and project, and of runtime.json
// (TestRuntimeWriter). Records and projects are values to it: one
// changed in place, behind its back, is not seen.
type RuntimeWriter struct {
	helpers recordSet
	applied appliedSet
	// runtime is runtime.json as last written, nets its networks'
	// encoding; nil until a write succeeds.
	runtime, nets []byte
}

// runtimeJSON is runtime.json.
type runtimeJSON struct {
	// Helpers and AppliedProjects are an older vmnetctl's: the records
	// and the projects themselves.
	Helpers         []HelperRecord    `json:"helpers"`
	AppliedNetworks *NetworksSnapshot `json:"appliedNetworks,omitempty"`
	AppliedProjects []*Project        `json:"appliedProjects,omitempty"`
	// Applied names the files of applied/ that hold the projects applied.
	Applied []string `json:"applied,omitempty"`
}

// Save writes rt's helpers' records, its projects and the rest to d,
// what changed since the last Save; runtime.json last.
func (w *RuntimeWriter) Save(d Dir, rt Runtime) error {
	if err := w.helpers.save(d, rt.Helpers); err != nil {
		return err
	}
	nets, err := json.Marshal(rt.AppliedNetworks)
	if err != nil {
		return fmt.Errorf("encoding %s: %w", runtimeFile, err)
	}
	// The same projects, one by one, and the same networks: nothing to
	// write, nothing allocated (a pass beside a thousand projects that
	// changes none of them).
	if w.applied.same(rt.AppliedProjects) && bytes.Equal(nets, w.nets) && w.runtime != nil && d.HasRuntime() {
		return nil
	}
	next, files, err := w.applied.write(d, rt.AppliedProjects)
	if err != nil {
		return err
	}
	data, err := json.Marshal(runtimeJSON{AppliedNetworks: rt.AppliedNetworks, Applied: files})
	if err != nil {
		return fmt.Errorf("encoding %s: %w", runtimeFile, err)
	}
	data = append(data, '\n')
	if !bytes.Equal(data, w.runtime) || !d.HasRuntime() {
		w.runtime = nil
		if err := d.writeProcessRecord(runtimeFile, data); err != nil {
			w.applied.saved = nil // its folder looked at again next time
			return fmt.Errorf("writing %s: %w", d.file(runtimeFile), err)
		}
		w.runtime = data
	}
	w.nets = nets
	// Only now are the files of the projects no longer applied unused.
	return w.applied.sweep(d, rt.AppliedProjects, next, files)
}

// recordFile is the record of attachment key's helper.
func recordFile(key string) string { return filepath.Join(recordsDir, fileKey(key)+".json") }

// sameProject: a project the controller applied again is the very one it
// had (statedir.ProjectReader gives the same one while its record is
// unchanged), or one equal to it.
func sameProject(a, b *Project) bool { return a == b || reflect.DeepEqual(a, b) }

// appliedSet is the projects as applied, in files of applied/ named by
// their content, as a RuntimeWriter last saved them.
type appliedSet struct {
	saved map[string]appliedProject // by project name; nil: none saved yet
	// last is the projects of the last save, in order.
	last []*Project
}

type appliedProject struct {
	p    *Project
	file string // in applied/
}

// same reports whether ps are the projects of the last save, one by one.
func (s *appliedSet) same(ps []*Project) bool {
	if s.saved == nil || len(ps) != len(s.last) {
		return false
	}
	for i, p := range ps {
		if p != s.last[i] {
			return false
		}
	}
	return true
}

// appliedFileOf is the file of applied/ that holds project p as encoded
// in data: its name (or "project", for a name no record could have) and
// its content's hash.
func appliedFileOf(p *Project, data []byte) string {
	name := p.Name
	if checkProjectName(name) != "" {
		name = "project"
	}
	sum := sha256.Sum256(data)
	return name + "." + hex.EncodeToString(sum[:8]) + ".json"
}

// write writes the files of the projects of ps that no file holds yet,
// and returns the set with ps, and the files, in ps' order.
func (s *appliedSet) write(d Dir, ps []*Project) (map[string]appliedProject, []string, error) {
	next := make(map[string]appliedProject, len(ps))
	files := make([]string, 0, len(ps))
	for _, p := range ps {
		if p == nil {
			return nil, nil, fmt.Errorf("encoding %s: a nil project", runtimeFile)
		}
		ap, ok := s.saved[p.Name]
		if !ok || !sameProject(ap.p, p) {
			data, err := json.Marshal(p)
			if err != nil {
				return nil, nil, fmt.Errorf("encoding project %s: %w", p.Name, err)
			}
			ap = appliedProject{p: p, file: appliedFileOf(p, data)}
			if err := d.writeProcessRecord(filepath.Join(appliedDir, ap.file), append(data, '\n')); err != nil {
				s.saved = nil // its folder looked at again next time
				return nil, nil, fmt.Errorf("saving project %s as applied: %w", p.Name, err)
			}
		}
		next[p.Name] = ap
		files = append(files, ap.file)
	}
	return next, files, nil
}

// sweep makes ps and next the set saved once runtime.json names their
// files, and removes the files of applied/ it does not name: on the
// first save, every other file (an earlier controller's, or one a crash
// left before its runtime.json), after that those of the projects that
// went or changed.
func (s *appliedSet) sweep(d Dir, ps []*Project, next map[string]appliedProject, files []string) error {
	keep := make(map[string]bool, len(files))
	for _, f := range files {
		keep[f] = true
	}
	var gone []string
	if s.saved == nil {
		entries, err := os.ReadDir(d.file(appliedDir))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		for _, e := range entries {
			gone = append(gone, e.Name())
		}
	} else {
		for _, ap := range s.saved {
			gone = append(gone, ap.file)
		}
	}
	s.saved, s.last = next, slices.Clone(ps)
	for _, f := range gone {
		if keep[f] {
			continue
		}
		if err := os.Remove(d.file(appliedDir, f)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			s.saved = nil // the folder looked at again next time
			return err
		}
	}
	return nil
}

// recordSet is the helpers' records in their files, as a RuntimeWriter
// last saved them, by key, each with the save that last saw it (gen);
// nil before the first save, and after a save that failed: the next
// writes every record, and removes the folder's other files.
type recordSet struct {
	saved map[string]*savedRecord
	gen   uint64
}

type savedRecord struct {
	rec HelperRecord
	gen uint64
}

// save writes the records of recs that are new or changed since the last
// save, and removes the files of the helpers no longer among them: a
// record unchanged costs a comparison, no allocation and no write.
func (s *recordSet) save(d Dir, recs []HelperRecord) error {
	first := s.saved == nil
	if first {
		s.saved = make(map[string]*savedRecord, len(recs))
	}
	s.gen++
	for _, r := range recs {
		if sv := s.saved[r.Key]; sv != nil && sv.rec.Equal(r) {
			sv.gen = s.gen
			continue
		}
		data, err := json.Marshal(r)
		if err == nil {
			err = d.writeProcessRecord(recordFile(r.Key), append(data, '\n'))
		}
		if err != nil {
			s.saved = nil // not known what is written: all again next time
			return fmt.Errorf("saving %s: %w", recordFile(r.Key), err)
		}
		s.saved[r.Key] = &savedRecord{rec: r.clone(), gen: s.gen}
	}
	if first {
		// Files of an earlier controller's helpers that no record names.
		entries, err := os.ReadDir(d.file(recordsDir))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			s.saved = nil
			return err
		}
		names := make(map[string]bool, len(s.saved))
		for key := range s.saved {
			names[filepath.Base(recordFile(key))] = true
		}
		for _, e := range entries {
			if !names[e.Name()] {
				if err := os.Remove(d.file(recordsDir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
					s.saved = nil
					return err
				}
			}
		}
		return nil
	}
	for key, sv := range s.saved {
		if sv.gen == s.gen {
			continue
		}
		if err := os.Remove(d.file(recordFile(key))); err != nil && !errors.Is(err, fs.ErrNotExist) {
			s.saved = nil
			return err
		}
		delete(s.saved, key)
	}
	return nil
}

// loadRecords reads the helpers' records (recordSet), by key.
func (d Dir) loadRecords() ([]HelperRecord, error) {
	names, err := d.jsonNames(recordsDir)
	if err != nil {
		return nil, fmt.Errorf("reading state: %w", err)
	}
	var recs []HelperRecord
	for _, name := range names {
		var r HelperRecord
		if _, err := d.readJSON(filepath.Join(recordsDir, name+".json"), &r); err != nil {
			return nil, err
		}
		recs = append(recs, r)
	}
	return recs, nil
}

// clone is h with its slices its own: what a RuntimeWriter keeps to
// compare the next record with.
func (h HelperRecord) clone() HelperRecord {
	h.Proc.Cmdline = slices.Clone(h.Proc.Cmdline)
	return h
}

// LoadRuntime reads what a controller recorded, its helpers' records in
// the order of their keys; found is false when none did.
func (d Dir) LoadRuntime() (rt Runtime, found bool, err error) {
	var rj runtimeJSON
	if found, err = d.readJSON(runtimeFile, &rj); err != nil {
		return rt, found, err
	}
	rt = Runtime{Helpers: rj.Helpers, AppliedNetworks: rj.AppliedNetworks, AppliedProjects: rj.AppliedProjects}
	for _, f := range rj.Applied {
		// A file gone or spoilt behind the controller's back: that project
		// counts as not applied (the next pass applies it again); the
		// helpers' records, read below, are what a controller adopts.
		p := &Project{}
		if ok, err := d.readJSON(filepath.Join(appliedDir, filepath.Base(f)), p); ok && err == nil {
			rt.AppliedProjects = append(rt.AppliedProjects, p)
		}
	}
	recs, err := d.loadRecords()
	if err != nil {
		return rt, found, err
	}
	if len(recs) > 0 {
		// A runtime.json of an older vmnetctl holds the records itself.
		byKey := make(map[string]bool, len(recs))
		for _, r := range recs {
			byKey[r.Key] = true
		}
		for _, r := range rt.Helpers {
			if !byKey[r.Key] {
				recs = append(recs, r)
			}
		}
		slices.SortFunc(recs, func(a, b HelperRecord) int { return strings.Compare(a.Key, b.Key) })
		rt.Helpers, found = recs, true
	}
	return rt, found, nil
}

// HasRuntime reports whether a controller's runtime record exists.
func (d Dir) HasRuntime() bool {
	_, err := os.Stat(d.file(runtimeFile))
	return err == nil
}

func runRecordFile(project string) string { return filepath.Join(runDir, project+".json") }

// SaveRunHelpers records the helpers `vmnetctl run` started for project.
func (d Dir) SaveRunHelpers(project string, recs []HelperRecord) error {
	return d.writeProcessJSON(runRecordFile(project), recs)
}

// RunHelpers returns the helpers `vmnetctl run` recorded for project.
func (d Dir) RunHelpers(project string) ([]HelperRecord, error) {
	var recs []HelperRecord
	_, err := d.readJSON(runRecordFile(project), &recs)
	return recs, err
}

// RemoveRunHelpers forgets the helpers of project's `vmnetctl run`.
func (d Dir) RemoveRunHelpers(project string) { os.Remove(d.file(runRecordFile(project))) }

// HelperIntent records a helper about to start, before its process exists:
// a helper that outlives its starter before runtime.json (or run's record)
// holds it is still accounted for. The helper is the process whose command
// line is Argv.
type HelperIntent struct {
	Key  string   `json:"key"`
	Argv []string `json:"argv"`
	// Starter is the process that starts it: a controller or `vmnetctl run`.
	Starter procid.Identity `json:"starter"`
}

func helperIntentFile(key string) string {
	return filepath.Join(helpersDir, fileKey(key)+".intent.json")
}

// SaveHelperIntent records that in.Starter is about to start the helper of
// attachment in.Key.
func (d Dir) SaveHelperIntent(in HelperIntent) error {
	return d.writeProcessJSON(helperIntentFile(in.Key), in)
}

// HelperIntents are the recorded intents (SaveHelperIntent); unreadable
// ones are skipped.
func (d Dir) HelperIntents() []HelperIntent {
	names, _ := filepath.Glob(filepath.Join(d.HelpersDir(), "*.intent.json"))
	var out []HelperIntent
	for _, name := range names {
		var in HelperIntent
		if found, err := d.readJSON(filepath.Join(helpersDir, filepath.Base(name)), &in); found && err == nil {
			out = append(out, in)
		}
	}
	return out
}

// RemoveHelperFiles removes the ready line, the stats and shaping files
// and the intent of attachment key's helper.
func (d Dir) RemoveHelperFiles(key string) {
	os.Remove(d.HelperReadyFile(key))
	os.Remove(d.HelperStatsFile(key))
	os.Remove(d.HelperShapingFile(key))
	os.Remove(d.file(helperIntentFile(key)))
}

// RemoveRuntimeIfNoProjects removes what only running networks and
// helpers need (removeRuntime), once nothing runs, only if no project is
// recorded, under the lock SaveProjectAndNetworks takes: false if a
// project was recorded, since the caller looked too. A controller that
// found no project tears down while `up` saves one; without the lock it
// could remove the networks.yaml that up had just saved.
func (d Dir) RemoveRuntimeIfNoProjects() (bool, error) {
	l, err := d.lockProjects()
	if err != nil {
		return false, err
	}
	defer l.Unlock()
	ps, err := d.Projects()
	if err != nil || len(ps) > 0 {
		return false, err
	}
	d.removeRuntime()
	return true, nil
}

// removeRuntime removes the runtime files. The projects, locks and log
// stay: the CLI may be writing a project, others may wait on the locks.
func (d Dir) removeRuntime() {
	for _, name := range []string{runtimeFile, recordsDir, appliedDir, helpersDir, vmsDir, leasesDir, runDir, networksSnapshotFile, networksYAMLFile} {
		os.RemoveAll(d.file(name))
	}
}

// Clean removes everything but the locks (others may be waiting on them),
// the controller's log and this host's WireGuard key, once nothing runs
// and no project is left.
func (d Dir) Clean() error {
	entries, err := os.ReadDir(d.Path)
	if err != nil {
		return nil
	}
	for _, e := range entries {
		switch e.Name() {
		case opsLockFile, controllerLockFile, projectsLockFile, controllerLogFile, eventsFile,
			wireGuardKeyFile: // the host's identity, which the other hosts list
			continue
		}
		if err := os.RemoveAll(d.file(e.Name())); err != nil {
			return err
		}
	}
	for _, name := range kept {
		if err := os.RemoveAll(d.file(name)); err != nil {
			return err
		}
	}
	return nil
}

// Log sizes: a log of the state dir is rotated once it passes its limit, so
// it takes at most twice that on disk (the log and its one rotated copy).
const (
	MaxHelperLog     = 4 << 20
	MaxControllerLog = 16 << 20
	MaxEventsLog     = 1 << 20
)

// RotateLog keeps the log at path under max bytes: past it, the log is
// copied to path.1 (replacing the previous copy) and emptied in place, so
// a writer that appends to it (a helper's stderr, opened O_APPEND) goes on
// writing at its new start. Lines written between the copy and the
// truncation are lost. It reports whether it rotated.
func RotateLog(path string, max int64) (bool, error) {
	f, err := openNoFollow(path, os.O_RDWR, 0)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil
		}
		return false, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() || fi.Size() <= max {
		return false, err
	}
	old := Dir{Path: filepath.Dir(path)}
	data, err := io.ReadAll(io.LimitReader(f, fi.Size()))
	if err != nil {
		return false, err
	}
	if err := old.writeFile(filepath.Base(path)+".1", data); err != nil {
		return false, err
	}
	return true, f.Truncate(0)
}
