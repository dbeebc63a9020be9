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
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/atomicfile"
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

// Runtime is what a controller runs and applied: runtime.json, with what
// was applied, and the helpers that run, each in a file of its own in the
// records folder (a runtime.json of an older vmnetctl holds them too).
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
// 13 MB at 10,000, written on every pass). runtime.json holds what was
// applied; it encodes again only the projects that changed since its
// last save, keeps each project's encoding, not the file's, and writes
// the file from the parts with writev. What it writes is json.Marshal's
// encoding of the Runtime without its helpers, and of each record
// (TestRuntimeWriter). Records and projects are values to it: one
// changed in place, behind its back, is not seen.
type RuntimeWriter struct {
	// helpers are the records in their files, by key, each with the
	// save that last saw it (gen); nil before the first save, and after
	// a save that failed: the next writes every record, and removes the
	// files of the others.
	helpers  map[string]*savedRecord
	gen      uint64
	projects map[string]*encoded[Project]
	// parts is the file as last written: literals, and the encodings
	// held in projects; nil until a write succeeds.
	parts    [][]byte
	networks []byte // the appliedNetworks part last written
	// spareParts is the slice of the Save before last, written over by
	// the next: not allocated again on every pass.
	spareParts [][]byte
}

type savedRecord struct {
	rec HelperRecord
	gen uint64
}

type encoded[T any] struct {
	v    T
	data []byte
}

// The literal parts of runtime.json, one slice each, so that a part is
// told unchanged by where it is (same).
var (
	litHelpers  = []byte(`{"helpers":`)
	litNull     = []byte("null")
	litOpen     = []byte("[")
	litComma    = []byte(",")
	litClose    = []byte("]")
	litNetworks = []byte(`,"appliedNetworks":`)
	litProjects = []byte(`,"appliedProjects":`)
	litEnd      = []byte("}\n")
)

// Save writes rt's helpers' records and the rest to d's runtime.json,
// what changed since the last Save.
func (w *RuntimeWriter) Save(d Dir, rt Runtime) error {
	if err := w.saveRecords(d, rt.Helpers); err != nil {
		return err
	}
	parts := append(w.spareParts[:0], litHelpers, litNull)
	var err error
	networks := w.networks
	if rt.AppliedNetworks != nil {
		data, err := json.Marshal(rt.AppliedNetworks)
		if err != nil {
			return fmt.Errorf("encoding %s: %w", runtimeFile, err)
		}
		if !bytes.Equal(data, networks) {
			networks = data
		}
		parts = append(parts, litNetworks, networks)
	}
	projects := map[string]*encoded[Project]{}
	if len(rt.AppliedProjects) > 0 {
		parts = append(parts, litProjects)
		var list []Project
		for _, p := range rt.AppliedProjects {
			if p == nil {
				return fmt.Errorf("encoding %s: a nil project", runtimeFile)
			}
			list = append(list, *p)
		}
		if parts, err = encodeList(parts, list, w.projects, projects, projectCodec); err != nil {
			return err
		}
	}
	parts = append(parts, litEnd)
	if same(parts, w.parts) && d.HasRuntime() {
		w.spareParts = parts
		return nil
	}
	old := w.parts
	w.parts = nil
	err = atomicfile.WriteFunc(d.file(runtimeFile), processRecord, func(f *os.File) error { return writeParts(f, parts) })
	if err != nil {
		w.spareParts = parts
		return fmt.Errorf("writing %s: %w", d.file(runtimeFile), err)
	}
	w.parts, w.spareParts, w.projects, w.networks = parts, old, projects, networks
	return nil
}

// recordFile is the record of attachment key's helper.
func recordFile(key string) string { return filepath.Join(recordsDir, fileKey(key)+".json") }

// saveRecords writes the records of recs that are new or changed since
// the last save, and removes the files of the helpers no longer among
// them: a record unchanged costs a comparison, no allocation and no
// write. On the writer's first save, every record is written and every
// other file in the folder removed.
func (w *RuntimeWriter) saveRecords(d Dir, recs []HelperRecord) error {
	first := w.helpers == nil
	if first {
		w.helpers = make(map[string]*savedRecord, len(recs))
	}
	w.gen++
	for _, r := range recs {
		if s := w.helpers[r.Key]; s != nil && s.rec.Equal(r) {
			s.gen = w.gen
			continue
		}
		data, err := json.Marshal(r)
		if err == nil {
			err = d.writeProcessRecord(recordFile(r.Key), append(data, '\n'))
		}
		if err != nil {
			w.helpers = nil // not known what is written: all again next time
			return fmt.Errorf("saving %s: %w", recordFile(r.Key), err)
		}
		w.helpers[r.Key] = &savedRecord{rec: r.clone(), gen: w.gen}
	}
	if first {
		// Files of an earlier controller's helpers that no record names.
		entries, err := os.ReadDir(d.file(recordsDir))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			w.helpers = nil
			return err
		}
		names := make(map[string]bool, len(w.helpers))
		for key := range w.helpers {
			names[filepath.Base(recordFile(key))] = true
		}
		for _, e := range entries {
			if !names[e.Name()] {
				if err := os.Remove(d.file(recordsDir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
					w.helpers = nil
					return err
				}
			}
		}
		return nil
	}
	for key, s := range w.helpers {
		if s.gen == w.gen {
			continue
		}
		if err := os.Remove(d.file(recordFile(key))); err != nil && !errors.Is(err, fs.ErrNotExist) {
			w.helpers = nil
			return err
		}
		delete(w.helpers, key)
	}
	return nil
}

// loadRecords reads the helpers' records (saveRecords), by key.
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

// writeParts writes parts to f with writev, up to 1,024 parts a call
// (IOV_MAX): a file of 1,000 records in 3 calls and no copy of them (a
// buffer of 64 kB took 17 calls, 2 ms of a pass on this machine, where
// a syscall is dear).
func writeParts(f *os.File, parts [][]byte) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	for len(parts) > 0 {
		chunk := parts[:min(len(parts), 1024)]
		var n int
		var werr error
		if err := rc.Write(func(fd uintptr) bool {
			n, werr = unix.Writev(int(fd), chunk)
			return werr != unix.EAGAIN
		}); err != nil {
			return err
		}
		if werr != nil {
			return werr
		}
		// What a short write left (a full disk says so on the next
		// call): the rest of the chunk, the way os.File writes it.
		for _, p := range chunk {
			if n >= len(p) {
				n -= len(p)
				continue
			}
			if _, err := f.Write(p[n:]); err != nil {
				return err
			}
			n = 0
		}
		parts = parts[len(chunk):]
	}
	return nil
}

// same reports whether the parts of a and b are the same slices, one by
// one: a part kept from the last save is the very slice written then.
func same(a, b [][]byte) bool {
	if b == nil || len(a) != len(b) {
		return false
	}
	for i := range a {
		if len(a[i]) != len(b[i]) || len(a[i]) > 0 && &a[i][0] != &b[i][0] {
			return false
		}
	}
	return true
}

// codec says how encodeList keys, compares and keeps the values of a list.
type codec[T any] struct {
	key   func(T) string
	equal func(a, b T) bool
	// keep is the copy of a value that is encoded again, kept to compare
	// the next one with (its slices its own).
	keep func(T) T
}

// projectCodec is runtime.json's: projects are few (a fleet is one
// project of many VMs).
var projectCodec = codec[Project]{
	key:   func(p Project) string { return p.Name },
	equal: func(a, b Project) bool { return reflect.DeepEqual(a, b) },
	keep:  func(p Project) Project { return p },
}

// clone is h with its slices its own: what saveRecords keeps to compare
// the next record with.
func (h HelperRecord) clone() HelperRecord {
	h.Proc.Cmdline = slices.Clone(h.Proc.Cmdline)
	return h
}

// encodeList appends vs to parts as a JSON array (null when nil), each
// element from was if it is there unchanged, and records each in next by
// its key.
func encodeList[T any](parts [][]byte, vs []T, was, next map[string]*encoded[T], c codec[T]) ([][]byte, error) {
	if vs == nil {
		return append(parts, litNull), nil
	}
	parts = append(parts, litOpen)
	for i, v := range vs {
		if i > 0 {
			parts = append(parts, litComma)
		}
		key := c.key(v)
		e, ok := was[key]
		if !ok || !c.equal(e.v, v) {
			data, err := json.Marshal(v)
			if err != nil {
				return parts, fmt.Errorf("encoding %s: %w", runtimeFile, err)
			}
			e = &encoded[T]{v: c.keep(v), data: data}
		}
		next[key] = e
		parts = append(parts, e.data)
	}
	return append(parts, litClose), nil
}

// LoadRuntime reads what a controller recorded, its helpers' records in
// the order of their keys; found is false when none did.
func (d Dir) LoadRuntime() (rt Runtime, found bool, err error) {
	if found, err = d.readJSON(runtimeFile, &rt); err != nil {
		return rt, found, err
	}
	recs, err := d.loadRecords()
	if err != nil {
		return rt, found, err
	}
	if len(recs) > 0 {
		// A runtime.json of an older vmnetctl holds the records itself.
		byKey := map[string]bool{}
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
	for _, name := range []string{runtimeFile, recordsDir, helpersDir, vmsDir, leasesDir, runDir, networksSnapshotFile, networksYAMLFile} {
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
