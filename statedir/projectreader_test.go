package statedir

import (
	"os"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestProjectReader: the reader gives what Projects gives, decoding a
// record again only when its file changed: an unchanged project is the
// very one it gave before; a project saved again, one added and one
// removed are seen; a record turned garbage is an error, as Projects
// says.
func TestProjectReader(t *testing.T) {
	d := Dir{Path: t.TempDir()}
	save := func(p *Project) {
		t.Helper()
		if err := d.SaveProject(p); err != nil {
			t.Fatal(err)
		}
	}
	var r ProjectReader
	read := func() []*Project {
		t.Helper()
		got, err := r.Projects(d)
		if err != nil {
			t.Fatal(err)
		}
		want, err := d.Projects()
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("the reader's projects differ from Projects' (-want +got):\n%s", diff)
		}
		return got
	}
	if got := read(); len(got) != 0 {
		t.Fatalf("no project recorded: %v", got)
	}
	save(&Project{Name: "fleet", Files: []ProjectFile{{Path: "f.yaml", Data: []byte("vms: {a: {}}")}}})
	save(&Project{Name: "one", Files: []ProjectFile{{Path: "o.yaml", Data: []byte("vms: {b: {}}")}}})
	first := read()
	again := read()
	if first[0] != again[0] || first[1] != again[1] {
		t.Error("unchanged records were decoded again")
	}
	// The slice is the caller's to change (the controller drops from it
	// the projects whose holder is gone).
	_ = slices.DeleteFunc(again, func(p *Project) bool { return p.Name == "fleet" })
	if got := read(); len(got) != 2 || got[0] != first[0] {
		t.Fatalf("a caller's change to the slice changed the next: %v", got)
	}
	save(&Project{Name: "one", Files: []ProjectFile{{Path: "o.yaml", Data: []byte("vms: {c: {}}")}}})
	save(&Project{Name: "two"})
	got := read()
	if got[0] != first[0] {
		t.Error("the unchanged fleet was decoded again")
	}
	if got[1] == first[1] || string(got[1].Files[0].Data) != "vms: {c: {}}" {
		t.Errorf("the project saved again: %+v", got[1])
	}
	if _, err := d.DeleteProject("fleet"); err != nil {
		t.Fatal(err)
	}
	if got := read(); len(got) != 2 || got[0].Name != "one" {
		t.Errorf("after fleet's removal: %v", got)
	}
	if err := os.WriteFile(d.file(projectsDir, "two.json"), []byte("\x00garbage{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Projects(d); err == nil {
		t.Error("a garbage record read without an error")
	}
	// Said again while it is garbage: the watch's news of it is not
	// taken by the failed read.
	if _, err := r.Projects(d); err == nil {
		t.Error("a garbage record read without an error the second time")
	}
	save(&Project{Name: "two", VMName: "x"})
	if got := read(); len(got) != 2 || got[1].VMName != "x" {
		t.Errorf("after two was mended: %v", got)
	}
	// Written in place (no rename), then the folder removed and made
	// again: each seen.
	if err := os.WriteFile(d.file(projectsDir, "two.json"), []byte(`{"name":"two","vmName":"y"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := read(); got[1].VMName != "y" {
		t.Errorf("a record written in place: %+v", got[1])
	}
	if err := os.RemoveAll(d.file(projectsDir)); err != nil {
		t.Fatal(err)
	}
	if got := read(); len(got) != 0 {
		t.Errorf("the folder removed: %v", got)
	}
	save(&Project{Name: "three"})
	read()
	save(&Project{Name: "four"})
	if got := read(); len(got) != 2 {
		t.Errorf("the folder made again, two projects saved: %v", got)
	}
	// Closed, it still reads (every record), and watches no more.
	r.Close()
	save(&Project{Name: "five"})
	if got := read(); len(got) != 3 || r.watch != nil {
		t.Errorf("after Close: %v, watching %v", got, r.watch != nil)
	}
}

// TestProjectByName: Project reads the one record of that name, as
// Projects has it; none recorded is nil, not an error; a name that could
// leave the folder is refused.
func TestProjectByName(t *testing.T) {
	d := New(t.TempDir())
	for _, name := range []string{"a", "b"} {
		if err := d.SaveProject(&Project{Name: name, Files: []ProjectFile{{Path: name + ".yaml", Data: []byte("vms: {" + name + ": {}}")}}}); err != nil {
			t.Fatal(err)
		}
	}
	all, err := d.Projects()
	if err != nil {
		t.Fatal(err)
	}
	got, err := d.Project("b")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(all[1], got); diff != "" {
		t.Errorf("Project(b) differs from Projects' (-want +got):\n%s", diff)
	}
	if p, err := d.Project("c"); p != nil || err != nil {
		t.Errorf("Project(c), none recorded: %v, %v", p, err)
	}
	if _, err := d.Project("../b"); err == nil {
		t.Error("Project(../b) read without an error")
	}
}
