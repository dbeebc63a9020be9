package statedir

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/vmnetctl/vmnetctl/procid"
)

// TestRuntimeWriter: what RuntimeWriter writes, through a run of changes
// (records added, changed, removed, projects changed, a pass that changes
// nothing), is json.Marshal's encoding each time, and a save that changes
// nothing writes nothing.
func TestRuntimeWriter(t *testing.T) {
	d := Dir{Path: t.TempDir()}
	rec := func(i, restarts int) HelperRecord {
		return HelperRecord{Key: fmt.Sprintf("vm%d/0", i), VM: fmt.Sprintf("vm%d", i), Network: "shared", Project: "p",
			MAC: fmt.Sprintf("52:00:00:00:00:%02x", i), Proc: procid.Identity{PID: 100 + i, StartTime: 7, Cmdline: []string{"vmnetctl", "helper", "<&>"}},
			Ready: `{"vmnet_mtu":1500}`, StartedAt: time.Unix(int64(i), 0).UTC(), Restarts: restarts}
	}
	proj := func(name, data string) *Project {
		return &Project{Name: name, Files: []ProjectFile{{Path: name + ".yaml", Data: []byte(data)}}, UID: 1000}
	}
	var w RuntimeWriter
	steps := []Runtime{
		{},
		{Helpers: []HelperRecord{rec(1, 0)}, AppliedNetworks: &NetworksSnapshot{Source: "n.yaml", Data: []byte("vmnet: {}")}, AppliedProjects: []*Project{proj("p", "vms: {}")}},
		{Helpers: []HelperRecord{rec(1, 0), rec(2, 0)}, AppliedProjects: []*Project{proj("p", "vms: {}"), proj("q", "x")}},
		{Helpers: []HelperRecord{rec(1, 1), rec(2, 0)}, AppliedProjects: []*Project{proj("p", "vms: {a: {}}"), proj("q", "x")}},
		{Helpers: []HelperRecord{rec(2, 0)}, AppliedProjects: []*Project{proj("q", "x")}},
		{Helpers: []HelperRecord{}},
	}
	// A record left by an earlier controller, whose helper is gone: the
	// writer's first save removes it.
	if err := d.writeProcessRecord(recordFile("gone/0"), []byte("{}\n")); err != nil {
		t.Fatal(err)
	}
	old := time.Unix(1, 0)
	for i, rt := range steps {
		for range 2 { // the second save of the same state writes nothing
			if err := w.Save(d, rt); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(d.file(runtimeFile))
			if err != nil {
				t.Fatal(err)
			}
			var rj runtimeJSON
			if err := json.Unmarshal(got, &rj); err != nil {
				t.Fatal(err)
			}
			want, _ := json.Marshal(runtimeJSON{AppliedNetworks: rt.AppliedNetworks, Applied: rj.Applied})
			if diff := cmp.Diff(string(want)+"\n", string(got)); diff != "" {
				t.Fatalf("step %d: runtime.json differs from json.Marshal's (-want +got):\n%s", i, diff)
			}
			entries, _ := os.ReadDir(d.file(recordsDir))
			if len(entries) != len(rt.Helpers) {
				t.Fatalf("step %d: %d records for %d helpers", i, len(entries), len(rt.Helpers))
			}
			for _, r := range rt.Helpers {
				got, err := os.ReadFile(d.file(recordFile(r.Key)))
				if err != nil {
					t.Fatal(err)
				}
				want, _ := json.Marshal(r)
				if diff := cmp.Diff(string(want)+"\n", string(got)); diff != "" {
					t.Fatalf("step %d: %s's record differs from json.Marshal's (-want +got):\n%s", i, r.Key, diff)
				}
			}
			// Each project in a file that runtime.json names, and no
			// other file.
			entries, _ = os.ReadDir(d.file(appliedDir))
			if len(entries) != len(rt.AppliedProjects) || len(rj.Applied) != len(rt.AppliedProjects) {
				t.Fatalf("step %d: %d applied files, %d named, for %d projects", i, len(entries), len(rj.Applied), len(rt.AppliedProjects))
			}
			for j, p := range rt.AppliedProjects {
				got, err := os.ReadFile(d.file(appliedDir, rj.Applied[j]))
				if err != nil {
					t.Fatal(err)
				}
				want, _ := json.Marshal(p)
				if diff := cmp.Diff(string(want)+"\n", string(got)); diff != "" {
					t.Fatalf("step %d: project %s as applied differs from json.Marshal's (-want +got):\n%s", i, p.Name, diff)
				}
			}
			back, found, err := d.LoadRuntime()
			if err != nil || !found || !cmp.Equal(rt.Helpers, back.Helpers, cmpopts.EquateEmpty()) {
				t.Fatalf("step %d: loaded %+v, %v, %v; want the helpers %+v", i, back.Helpers, found, err, rt.Helpers)
			}
			if !cmp.Equal(rt.AppliedProjects, back.AppliedProjects, cmpopts.EquateEmpty()) {
				t.Fatalf("step %d: loaded the projects %+v, want %+v", i, back.AppliedProjects, rt.AppliedProjects)
			}
			// What the save wrote is aged: the next that writes it shows.
			os.Chtimes(d.file(runtimeFile), old, old)
			for _, r := range rt.Helpers {
				os.Chtimes(d.file(recordFile(r.Key)), old, old)
			}
			for _, f := range rj.Applied {
				os.Chtimes(d.file(appliedDir, f), old, old)
			}
		}
		fi, _ := os.Stat(d.file(runtimeFile))
		if !fi.ModTime().Equal(old) {
			t.Errorf("step %d: a save that changed nothing wrote runtime.json", i)
		}
		for _, r := range rt.Helpers {
			if fi, _ := os.Stat(d.file(recordFile(r.Key))); !fi.ModTime().Equal(old) {
				t.Errorf("step %d: a save that changed nothing wrote %s's record", i, r.Key)
			}
		}
		entries, _ := os.ReadDir(d.file(appliedDir))
		for _, e := range entries {
			if fi, _ := e.Info(); fi != nil && !fi.ModTime().Equal(old) {
				t.Errorf("step %d: a save that changed nothing wrote %s", i, e.Name())
			}
		}
	}
	// A record changed in a field of a slice is seen.
	r := rec(3, 0)
	w.Save(d, Runtime{Helpers: []HelperRecord{r}})
	r.Proc.Cmdline = []string{"other"}
	w.Save(d, Runtime{Helpers: []HelperRecord{r}})
	if back, _, err := d.LoadRuntime(); err != nil || back.Helpers[0].Proc.Cmdline[0] != "other" {
		t.Errorf("a record whose command line changed was saved as %+v (%v)", back.Helpers, err)
	}
}

// TestLoadRuntimeOfOlder: a runtime.json of an older vmnetctl, which
// holds its helpers' records and the projects applied itself, is read
// with them; the first save of a controller now moves them into files of
// their own.
func TestLoadRuntimeOfOlder(t *testing.T) {
	d := Dir{Path: t.TempDir()}
	recs := []HelperRecord{{Key: "a/0", VM: "a", MAC: "52:00:00:00:00:01"}, {Key: "b/0", VM: "b", MAC: "52:00:00:00:00:02"}}
	projects := []*Project{{Name: "p", UID: 1000}, {Name: "q", VMName: "b"}}
	data, _ := json.Marshal(Runtime{Helpers: recs, AppliedProjects: projects})
	if err := d.writeProcessRecord(runtimeFile, data); err != nil {
		t.Fatal(err)
	}
	rt, found, err := d.LoadRuntime()
	if err != nil || !found || !cmp.Equal(rt.Helpers, recs) {
		t.Fatalf("loaded %+v, %v, %v; want %+v", rt.Helpers, found, err, recs)
	}
	var w RuntimeWriter
	if err := w.Save(d, rt); err != nil {
		t.Fatal(err)
	}
	if got, _, err := d.LoadRuntime(); err != nil || !cmp.Equal(got.Helpers, recs) {
		t.Fatalf("after a save, loaded %+v, %v; want %+v", got.Helpers, err, recs)
	}
	if _, err := os.Stat(d.file(recordFile("b/0"))); err != nil {
		t.Errorf("b's record is not a file of its own: %v", err)
	}
	if got, _, err := d.LoadRuntime(); err != nil || !cmp.Equal(got.AppliedProjects, projects) {
		t.Fatalf("after a save, loaded the projects %+v, %v; want %+v", got.AppliedProjects, err, projects)
	}
	if entries, _ := os.ReadDir(d.file(appliedDir)); len(entries) != len(projects) {
		t.Errorf("the projects as applied are not files of their own: %v", entries)
	}
}

// TestHelperRecordEqual: every field of a helper's record, and of its
// process's identity, counts in Equal: a record changed in any field is
// encoded again by the RuntimeWriter (a field added later and left out
// of Equal fails here).
func TestHelperRecordEqual(t *testing.T) {
	base := HelperRecord{Key: "a/0", VM: "a", Network: "n", Project: "p", MAC: "52:55:55:00:00:01", Attach: "socket",
		Proc: procid.Identity{PID: 1, StartTime: 2, Cmdline: []string{"vmnetctl", "helper"}}, Socket: "/s", Tap: "vmt-a",
		Ready: "{}", StartedAt: time.Unix(100, 0), Restarts: 1}
	changed := func(v reflect.Value) bool {
		switch {
		case v.Type() == reflect.TypeFor[time.Time]():
			v.Set(reflect.ValueOf(time.Unix(200, 0)))
		case v.Kind() == reflect.String:
			v.SetString(v.String() + "x")
		case v.Kind() == reflect.Int, v.Kind() == reflect.Int64:
			v.SetInt(v.Int() + 1)
		case v.Kind() == reflect.Uint64:
			v.SetUint(v.Uint() + 1)
		case v.Kind() == reflect.Slice:
			v.Set(reflect.Append(v, reflect.ValueOf("more")))
		default:
			return false
		}
		return true
	}
	for i := range reflect.TypeFor[HelperRecord]().NumField() {
		f := reflect.TypeFor[HelperRecord]().Field(i)
		if f.Type == reflect.TypeFor[procid.Identity]() {
			for j := range f.Type.NumField() {
				r := base
				r.Proc.Cmdline = slices.Clone(base.Proc.Cmdline)
				if !changed(reflect.ValueOf(&r.Proc).Elem().Field(j)) {
					t.Fatalf("Proc.%s: no way to change it here", f.Type.Field(j).Name)
				}
				if r.Equal(base) {
					t.Errorf("a record whose Proc.%s changed is Equal", f.Type.Field(j).Name)
				}
			}
			continue
		}
		r := base
		if !changed(reflect.ValueOf(&r).Elem().Field(i)) {
			t.Fatalf("%s: no way to change it here", f.Name)
		}
		if r.Equal(base) {
			t.Errorf("a record whose %s changed is Equal", f.Name)
		}
	}
	if r := base; !r.Equal(base) {
		t.Error("a record is not Equal to its copy")
	}
}

// TestAppliedWholeAfterCrash: a controller killed after a pass wrote the
// files of its projects and before its runtime.json leaves the last
// pass's networks and projects together: a network and the project that
// came with it, or went with it, are both there or both not. The next
// controller's first save removes the files no runtime.json names.
func TestAppliedWholeAfterCrash(t *testing.T) {
	d := Dir{Path: t.TempDir()}
	netsA := &NetworksSnapshot{Source: "n.yaml", Data: []byte("vmnet: {a: {}}")}
	netsAB := &NetworksSnapshot{Source: "n.yaml", Data: []byte("vmnet: {a: {}, b: {}}")}
	p := &Project{Name: "p", Files: []ProjectFile{{Path: "p.yaml", Data: []byte("vms: {x: {networks: [{vmnet: a}]}}")}}}
	q := &Project{Name: "q", Files: []ProjectFile{{Path: "q.yaml", Data: []byte("vms: {y: {networks: [{vmnet: b}]}}")}}}
	before := Runtime{AppliedNetworks: netsA, AppliedProjects: []*Project{p}}
	after := Runtime{AppliedNetworks: netsAB, AppliedProjects: []*Project{p, q}}
	for _, step := range []struct{ from, to Runtime }{{before, after}, {after, before}} {
		var w RuntimeWriter
		if err := w.Save(d, step.from); err != nil {
			t.Fatal(err)
		}
		was, err := os.ReadFile(d.file(runtimeFile))
		if err != nil {
			t.Fatal(err)
		}
		// The crash: the pass writes its projects' files, and its
		// runtime.json cannot take the place of the last (a folder there,
		// not empty), as if it died then; the last is put back.
		if err := os.Remove(d.file(runtimeFile)); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(d.file(runtimeFile, "x"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := w.Save(d, step.to); err == nil {
			t.Fatal("a save whose runtime.json could not be written succeeded")
		}
		if err := os.RemoveAll(d.file(runtimeFile)); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(d.file(runtimeFile), was, 0o600); err != nil {
			t.Fatal(err)
		}
		got, _, err := d.LoadRuntime()
		if err != nil {
			t.Fatal(err)
		}
		if !cmp.Equal(got.AppliedNetworks, step.from.AppliedNetworks) || !cmp.Equal(got.AppliedProjects, step.from.AppliedProjects) {
			t.Errorf("after a crash before runtime.json: networks %s, projects %d; want the last pass's whole: %s, %d",
				got.AppliedNetworks.Data, len(got.AppliedProjects), step.from.AppliedNetworks.Data, len(step.from.AppliedProjects))
		}
		// The next controller's first save leaves only what it names.
		var next RuntimeWriter
		if err := next.Save(d, got); err != nil {
			t.Fatal(err)
		}
		if entries, _ := os.ReadDir(d.file(appliedDir)); len(entries) != len(got.AppliedProjects) {
			t.Errorf("after the next controller's first save: %d files for %d projects", len(entries), len(got.AppliedProjects))
		}
	}
}

// TestAppliedOddProjects: what the projects' records may hold, however
// odd, is saved and read back: two records of one name (a record copied
// under another file name), a name that is no project's (it could leave
// the folder), and a file removed behind the writer's back, which costs
// its project alone (it counts as not applied), not the helpers'
// records.
func TestAppliedOddProjects(t *testing.T) {
	d := Dir{Path: t.TempDir()}
	a1 := &Project{Name: "a", VMName: "one"}
	a2 := &Project{Name: "a", VMName: "two"}
	odd := &Project{Name: "../../escaped"}
	rec := HelperRecord{Key: "x/0", VM: "x", MAC: "52:00:00:00:00:01"}
	rt := Runtime{Helpers: []HelperRecord{rec}, AppliedProjects: []*Project{a1, a2, odd}}
	var w RuntimeWriter
	for range 2 { // the second save: the writer's memory of the first
		if err := w.Save(d, rt); err != nil {
			t.Fatal(err)
		}
		got, _, err := d.LoadRuntime()
		if err != nil || !cmp.Equal(got.AppliedProjects, rt.AppliedProjects) {
			t.Fatalf("loaded %+v, %v; want %+v", got.AppliedProjects, err, rt.AppliedProjects)
		}
	}
	if _, err := os.Stat(filepath.Join(d.Path, "escaped")); err == nil || len(mustReadDir(t, d.file(appliedDir))) != 3 {
		t.Errorf("the projects' files are not the three of applied/: %v", mustReadDir(t, d.file(appliedDir)))
	}
	if err := os.Remove(d.file(appliedDir, mustReadDir(t, d.file(appliedDir))[0])); err != nil {
		t.Fatal(err)
	}
	got, found, err := d.LoadRuntime()
	if err != nil || !found || len(got.AppliedProjects) != 2 || len(got.Helpers) != 1 {
		t.Errorf("a project's file gone: %d projects, %d helpers, %v, %v; want 2, 1", len(got.AppliedProjects), len(got.Helpers), found, err)
	}
}

func mustReadDir(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}
