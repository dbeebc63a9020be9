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

// Runtime is runtime.json: the helpers that run and what was applied.
type Runtime struct {
	Helpers         []HelperRecord    `json:"helpers"`
	AppliedNetworks *NetworksSnapshot `json:"appliedNetworks,omitempty"`
	AppliedProjects []*Project        `json:"appliedProjects,omitempty"`
}

// SaveRuntime records what the controller runs: compact JSON, since the
// controller writes it on every pass that changed something, with every
// helper and project in it (indented, a fleet's record costs twice the
// time to write).
func (d Dir) SaveRuntime(rt Runtime) error {
	_, err := d.SaveRuntimeIfChanged(rt, nil)
	return err
}

// SaveRuntimeIfChanged is SaveRuntime that writes nothing when rt encodes
// to last, what it saved before; it returns what it saved. A controller's
// pass that changed nothing costs no write (a thousand helpers' records,
// synced to disk).
func (d Dir) SaveRuntimeIfChanged(rt Runtime, last []byte) ([]byte, error) {
	data, err := json.Marshal(rt)
	if err != nil {
		return last, fmt.Errorf("encoding %s: %w", runtimeFile, err)
	}
	data = append(data, '\n')
	if bytes.Equal(data, last) && d.HasRuntime() {
		return last, nil
	}
	if err := d.writeFile(runtimeFile, data); err != nil {
		return nil, err
	}
	return data, nil
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
	return d.writeJSON(runRecordFile(project), recs)
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
	return d.writeJSON(helperIntentFile(in.Key), in)
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

// RemoveHelperFiles removes the ready line and the intent of attachment
// key's helper.
func (d Dir) RemoveHelperFiles(key string) {
	os.Remove(d.HelperReadyFile(key))
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
