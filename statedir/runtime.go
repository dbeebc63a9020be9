package statedir

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/procid"
)

// HelperRecord is what is kept about a running helper, so that a new
// controller can adopt it after a crash.
type HelperRecord struct {
	Key       string          `json:"key"`
	VM        string          `json:"vm"`
	Index     int             `json:"index"`
	Network   string          `json:"network"`
	Project   string          `json:"project"`
	MAC       string          `json:"mac"`
	Attach    api.AttachKind  `json:"attach"`
	Proc      procid.Identity `json:"proc"`
	Socket    string          `json:"socket,omitempty"`
	Tap       string          `json:"tap,omitempty"`
	Ready     string          `json:"ready"`
	StartedAt time.Time       `json:"startedAt"`
	Restarts  int             `json:"restarts"`
}

// Equal reports whether h and o are the same record, field by field
// (TestHelperRecordEqual checks that every field counts).
func (h HelperRecord) Equal(o HelperRecord) bool {
	return h.Key == o.Key && h.VM == o.VM && h.Index == o.Index && h.Network == o.Network && h.Project == o.Project &&
		h.MAC == o.MAC && h.Attach == o.Attach && h.Proc.Equal(o.Proc) && h.Socket == o.Socket && h.Tap == o.Tap &&
		h.Ready == o.Ready && h.StartedAt.Equal(o.StartedAt) && h.StartedAt.Location() == o.StartedAt.Location() &&
		h.Restarts == o.Restarts
}

// Runtime is runtime.json: the helpers that run and what was applied.
type Runtime struct {
	Helpers         []HelperRecord    `json:"helpers"`
	AppliedNetworks *NetworksSnapshot `json:"appliedNetworks,omitempty"`
	AppliedProjects []*Project        `json:"appliedProjects,omitempty"`
}

// SaveRuntime records what the controller runs: compact JSON, since the
// controller writes it on every pass that changed something, with every
// helper and project in it (indented, a fleet's record costs twice the
// time to write). A controller saves through a RuntimeWriter.
func (d Dir) SaveRuntime(rt Runtime) error {
	var w RuntimeWriter
	return w.Save(d, rt)
}

// RuntimeWriter saves runtime.json for a controller that saves on every
// pass: it writes nothing when the state is what it wrote last, and it
// encodes again only the helpers' records and the projects
// that changed since its last save, so that a pass that attaches one VM
// beside a thousand encodes one record, not a thousand. What it writes is
// json.Marshal's encoding of the Runtime (TestRuntimeWriter). Records and
// projects are values to it: one changed in place, behind its back, is not
// seen.
type RuntimeWriter struct {
	helpers  map[string]*encoded[HelperRecord]
	projects map[string]*encoded[Project]
	last     []byte
	// spare is the buffer of the Save before last, written over by the
	// next: a fleet's record (a megabyte at 1,000 VMs) is not allocated
	// again on every pass.
	spare []byte
	// spareHelpers is, as spare, the map of the Save before last.
	spareHelpers map[string]*encoded[HelperRecord]
}

type encoded[T any] struct {
	v    T
	data []byte
}

// Save writes rt to d's runtime.json unless it is what the last Save
// wrote.
func (w *RuntimeWriter) Save(d Dir, rt Runtime) error {
	b := bytes.NewBuffer(w.spare[:0])
	b.Grow(len(w.last) + 4096) // about what it was: no copies as it grows
	b.WriteString(`{"helpers":`)
	helpers := w.spareHelpers
	if helpers == nil {
		helpers = make(map[string]*encoded[HelperRecord], len(rt.Helpers))
	}
	clear(helpers)
	if err := encodeList(b, rt.Helpers, w.helpers, helpers, recordCodec); err != nil {
		return err
	}
	if rt.AppliedNetworks != nil {
		data, err := json.Marshal(rt.AppliedNetworks)
		if err != nil {
			return fmt.Errorf("encoding %s: %w", runtimeFile, err)
		}
		b.WriteString(`,"appliedNetworks":`)
		b.Write(data)
	}
	projects := map[string]*encoded[Project]{}
	if len(rt.AppliedProjects) > 0 {
		b.WriteString(`,"appliedProjects":`)
		var list []Project
		for _, p := range rt.AppliedProjects {
			if p == nil {
				return fmt.Errorf("encoding %s: a nil project", runtimeFile)
			}
			list = append(list, *p)
		}
		if err := encodeList(b, list, w.projects, projects, projectCodec); err != nil {
			return err
		}
	}
	b.WriteString("}\n")
	data := b.Bytes()
	if bytes.Equal(data, w.last) && d.HasRuntime() {
		w.spare, w.spareHelpers = data, helpers
		return nil
	}
	old := w.last
	w.last = nil
	if err := d.writeProcessRecord(runtimeFile, data); err != nil {
		w.spare, w.spareHelpers = data, helpers
		return err
	}
	w.spareHelpers = w.helpers
	w.last, w.spare, w.helpers, w.projects = data, old, helpers, projects
	return nil
}

// codec says how encodeList keys, compares and keeps the values of a list.
type codec[T any] struct {
	key   func(T) string
	equal func(a, b T) bool
	// keep is the copy of a value that is encoded again, kept to compare
	// the next one with (its slices its own).
	keep func(T) T
}

var (
	recordCodec = codec[HelperRecord]{
		key:   func(h HelperRecord) string { return h.Key },
		equal: HelperRecord.Equal,
		keep: func(h HelperRecord) HelperRecord {
			h.Proc.Cmdline = slices.Clone(h.Proc.Cmdline)
			return h
		},
	}
	// Projects are few (a fleet is one project of many VMs).
	projectCodec = codec[Project]{
		key:   func(p Project) string { return p.Name },
		equal: func(a, b Project) bool { return reflect.DeepEqual(a, b) },
		keep:  func(p Project) Project { return p },
	}
)

// encodeList writes vs as a JSON array (null when nil), each element from
// was if it is there unchanged, and records each in next by its key.
func encodeList[T any](b *bytes.Buffer, vs []T, was, next map[string]*encoded[T], c codec[T]) error {
	if vs == nil {
		b.WriteString("null")
		return nil
	}
	b.WriteByte('[')
	for i, v := range vs {
		if i > 0 {
			b.WriteByte(',')
		}
		key := c.key(v)
		e, ok := was[key]
		if !ok || !c.equal(e.v, v) {
			data, err := json.Marshal(v)
			if err != nil {
				return fmt.Errorf("encoding %s: %w", runtimeFile, err)
			}
			e = &encoded[T]{v: c.keep(v), data: data}
		}
		next[key] = e
		b.Write(e.data)
	}
	b.WriteByte(']')
	return nil
}

// LoadRuntime reads what a controller recorded; found is false when none did.
func (d Dir) LoadRuntime() (rt Runtime, found bool, err error) {
	found, err = d.readJSON(runtimeFile, &rt)
	return rt, found, err
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
	for _, name := range []string{runtimeFile, helpersDir, vmsDir, leasesDir, runDir, networksSnapshotFile, networksYAMLFile} {
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
