package statedir

import (
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/procid"
)

// TestNameTaken: `up` (and the projects' API) does not record a project
// in place of one vmnetctl keeps for itself, named or not, nor, when its
// name came from its file, in place of another file's of the same name;
// the same file again, or a name given with -p, replaces.
func TestNameTaken(t *testing.T) {
	file := func(abs string) []ProjectFile { return []ProjectFile{{Path: "vms.yaml", Abs: abs}} }
	p := &Project{Name: "vms", Files: file("/a/vms.yaml")}
	for _, tc := range []struct {
		q         *Project
		nameGiven bool
		want      string // in the error; "" for none
	}{
		{nil, false, ""},
		{&Project{Name: "vms", Files: file("/a/vms.yaml")}, false, ""},
		{&Project{Name: "vms", Files: file("/b/vms.yaml")}, false, "-p NAME"},
		{&Project{Name: "vms", Files: file("/b/vms.yaml")}, true, ""},
		{&Project{Name: "vms", Networks: []string{"shared"}}, true, "vmnetctl's own"},
		{&Project{Name: "vms", External: true, Files: file("/a/vms.yaml")}, true, "vmnetctl's own"},
		{&Project{Name: "vms", Holder: &procid.Identity{PID: 1}}, false, "vmnetctl's own"},
	} {
		err := NameTaken(p, tc.q, tc.nameGiven)
		if (err == nil) != (tc.want == "") || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("in place of %+v (name given: %v): %v, want %q", tc.q, tc.nameGiven, err, tc.want)
		}
	}
}
