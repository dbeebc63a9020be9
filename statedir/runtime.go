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
// encodes again only the helpers' records and the projects that changed
// since its last save, so that a pass that attaches one VM beside a
// thousand encodes one record, not a thousand. It keeps each record's
// encoding, not the file's: what changed is told by which parts are new,
// and the file is written from the parts with writev (at 10,000 helpers
// the file, kept whole twice and grown by doubling, was 50 MB of the
// controller's heap). What it writes is json.Marshal's encoding of
// the Runtime (TestRuntimeWriter). Records and projects are values to
// it: one changed in place, behind its back, is not seen.
type RuntimeWriter struct {
	helpers  map[string]*encoded[HelperRecord]
	projects map[string]*encoded[Project]
	// parts is the file as last written: literals, and the encodings
	// held in helpers and projects; nil until a write succeeds.
	parts    [][]byte
	networks []byte // the appliedNetworks part last written
	// spare* are the slices and map of the Save before last, written
	// over by the next: not allocated again on every pass.
	spareParts   [][]byte
	spareHelpers map[string]*encoded[HelperRecord]
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

// Save writes rt to d's runtime.json unless it is what the last Save
// wrote.
func (w *RuntimeWriter) Save(d Dir, rt Runtime) error {
	parts := append(w.spareParts[:0], litHelpers)
	helpers := w.spareHelpers
	if helpers == nil {
		helpers = make(map[string]*encoded[HelperRecord], len(rt.Helpers))
	}
	clear(helpers)
	var err error
	if parts, err = encodeList(parts, rt.Helpers, w.helpers, helpers, recordCodec); err != nil {
		return err
	}
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
		w.spareParts, w.spareHelpers = parts, helpers
		return nil
	}
	old := w.parts
	w.parts = nil
	err = atomicfile.WriteFunc(d.file(runtimeFile), processRecord, func(f *os.File) error { return writeParts(f, parts) })
	if err != nil {
		w.spareParts, w.spareHelpers = parts, helpers
		return fmt.Errorf("writing %s: %w", d.file(runtimeFile), err)
	}
	w.spareHelpers = w.helpers
	w.parts, w.spareParts, w.helpers, w.projects, w.networks = parts, old, helpers, projects, networks
	return nil
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
