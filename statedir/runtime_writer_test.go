package statedir

import (
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
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
	for i, rt := range steps {
		for range 2 { // the second save of the same state writes nothing
			if err := w.Save(d, rt); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(d.file(runtimeFile))
			if err != nil {
				t.Fatal(err)
			}
			want, _ := json.Marshal(rt)
			if diff := cmp.Diff(string(want)+"\n", string(got)); diff != "" {
				t.Fatalf("step %d: runtime.json differs from json.Marshal's (-want +got):\n%s", i, diff)
			}
			os.Chtimes(d.file(runtimeFile), time.Unix(1, 0), time.Unix(1, 0))
		}
		fi, _ := os.Stat(d.file(runtimeFile))
		if !fi.ModTime().Equal(time.Unix(1, 0)) {
			t.Errorf("step %d: a save that changed nothing wrote runtime.json", i)
		}
	}
	// A record changed in a field of a slice is seen.
	r := rec(3, 0)
	w.Save(d, Runtime{Helpers: []HelperRecord{r}})
	r.Proc.Cmdline = []string{"other"}
	w.Save(d, Runtime{Helpers: []HelperRecord{r}})
	var back Runtime
	if _, err := d.readJSON(runtimeFile, &back); err != nil || back.Helpers[0].Proc.Cmdline[0] != "other" {
		t.Errorf("a record whose command line changed was saved as %+v (%v)", back.Helpers, err)
	}
}
