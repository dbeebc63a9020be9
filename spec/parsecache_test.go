package spec

import (
	"slices"
	"testing"

	"github.com/vmnetctl/vmnetctl/spec/spectest"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// TestParseCache: a project is parsed again only when its files change
// (not when the reader gives an equal record anew); the cache holds the
// projects of the last Parse only; Peek changes nothing; each call gets
// clones, which Resolve may write into.
func TestParseCache(t *testing.T) {
	vmsOf := func(pp []ParsedProject) []string {
		var names []string
		for _, p := range pp {
			for _, f := range p.Files {
				for _, vm := range f.VMs {
					names = append(names, p.Name+"/"+vm.Name)
				}
			}
		}
		return names
	}
	a := spectest.Project("a", "vms:\n  a1:\n    networks: [{vmnet: shared}]\n")
	b := spectest.Project("b", "vms:\n  b1:\n    networks: [{vmnet: shared}]\n  b2:\n    networks: [{vmnet: host}]\n")
	var c ParseCache
	got, diags := c.Parse([]*statedir.Project{a, b})
	if err := diags.Err(); err != nil || !slices.Equal(vmsOf(got), []string{"a/a1", "b/b1", "b/b2"}) {
		t.Fatalf("first parse: %v %v", vmsOf(got), err)
	}
	parsedA := c["a"].Files[0]
	// Resolve writes into what it is given: not into the cache.
	got[0].Files[0].VMs[0].Attachments[0].MAC = "52:55:55:ff:ff:ff"
	got[0].Files[0].VMs[0].Name = "changed"
	// a's record given anew, the same; b gone; d new.
	a2 := spectest.Project("a", "vms:\n  a1:\n    networks: [{vmnet: shared}]\n")
	d := spectest.Project("d", "vms:\n  d1:\n    networks: [{vmnet: shared}]\n")
	got, _ = c.Parse([]*statedir.Project{a2, d})
	if !slices.Equal(vmsOf(got), []string{"a/a1", "d/d1"}) || got[0].Files[0].VMs[0].Attachments[0].MAC == "52:55:55:ff:ff:ff" {
		t.Errorf("second parse: %v, a1's MAC %s", vmsOf(got), got[0].Files[0].VMs[0].Attachments[0].MAC)
	}
	if c["a"].Files[0] != parsedA || c["a"].src != a2 {
		t.Errorf("a, unchanged, was parsed again (or its record not taken)")
	}
	if _, ok := c["b"]; ok || len(c) != 2 {
		t.Errorf("the cache holds %d projects (b gone: %v), want a and d", len(c), ok)
	}
	// a changed: parsed again.
	a3 := spectest.Project("a", "vms:\n  a9:\n    networks: [{vmnet: shared}]\n")
	if got, _ := c.Parse([]*statedir.Project{a3, d}); !slices.Equal(vmsOf(got), []string{"a/a9", "d/d1"}) {
		t.Errorf("a changed: %v", vmsOf(got))
	}
	// Peek: e new, a given anew; the cache as it was.
	e := spectest.Project("e", "vms:\n  e1:\n    networks: [{vmnet: shared}]\n")
	a4 := spectest.Project("a", "vms:\n  a9:\n    networks: [{vmnet: shared}]\n")
	if got, _ := c.Peek([]*statedir.Project{a4, e}); !slices.Equal(vmsOf(got), []string{"a/a9", "e/e1"}) {
		t.Errorf("peek: %v", vmsOf(got))
	}
	if _, ok := c["e"]; ok || c["a"].src != a3 || len(c) != 2 {
		t.Errorf("peek changed the cache: e cached %v, a's record the peek's %v", ok, c["a"].src == a4)
	}
	// The same file read elsewhere (a lima instance's, named by its
	// folder): parsed again.
	lima := []byte("networks:\n  - vmnet: shared\n")
	vm1 := &statedir.Project{Name: "l", Files: []statedir.ProjectFile{{Path: "lima.yaml", Abs: "/home/u/.lima/vm1/lima.yaml", Data: lima}}}
	vm2 := &statedir.Project{Name: "l", Files: []statedir.ProjectFile{{Path: "lima.yaml", Abs: "/home/u/.lima/vm2/lima.yaml", Data: lima}}}
	c.Parse([]*statedir.Project{vm1})
	if got, _ := c.Parse([]*statedir.Project{vm2}); !slices.Equal(vmsOf(got), []string{"l/vm2"}) {
		t.Errorf("the same file read in another folder: %v, want l/vm2", vmsOf(got))
	}
}
