package ops

import (
	"testing"

	"github.com/vmnetctl/vmnetctl/backends"
	"github.com/vmnetctl/vmnetctl/config"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// TestValidateReport: `validate --json` gives each problem as an object
// with its file, line and field, in file and line order as the text does,
// says whether the files are valid, and lists the attachments of valid
// ones.
func TestValidateReport(t *testing.T) {
	env := Env{StateDir: statedir.Dir{Path: t.TempDir()}}
	bad := &Input{
		Networks: statedir.NetworksSnapshot{Source: "n.yaml", Data: []byte("vmnet:\n  a:\n    mode: hostt\n")},
		Files:    []statedir.ProjectFile{{Path: "v.yaml", Data: []byte("vms:\n  x:\n    networks: [{vmnet: a}]\n")}},
	}
	r, err := ValidateReport(env, bad, backends.Default().Name())
	if err != nil {
		t.Fatal(err)
	}
	if r.Valid || len(r.Problems) == 0 {
		t.Fatalf("a bad mode: %+v", r)
	}
	p := r.Problems[0]
	if p.File != "n.yaml" || p.Line != 3 || p.Severity != "error" || p.Message == "" {
		t.Errorf("the problem: %+v, want n.yaml line 3, an error", p)
	}
	// A problem the resolver finds (line 4) and one the parser finds
	// (line 6): in file and line order, as the text lists them.
	both := &Input{
		Networks: statedir.NetworksSnapshot{Source: config.EmbeddedSource, Data: config.DefaultNetworks},
		Files:    []statedir.ProjectFile{{Path: "v.yaml", Data: []byte("vms:\n  x:\n    networks:\n      - vmnet: shraed\n      - vmnet: shared\n        macAddress: nope\n")}},
	}
	if r, err = ValidateReport(env, both, backends.Default().Name()); err != nil {
		t.Fatal(err)
	}
	if len(r.Problems) != 2 || r.Problems[0].Line != 4 || r.Problems[1].Line != 6 {
		t.Errorf("problems %+v, want lines 4 and 6 in that order", r.Problems)
	}
	good := &Input{
		Networks: statedir.NetworksSnapshot{Source: config.EmbeddedSource, Data: config.DefaultNetworks},
		Files:    []statedir.ProjectFile{{Path: "v.yaml", Data: []byte("vms:\n  x:\n    networks: [{vmnet: shared}]\n")}},
	}
	if r, err = ValidateReport(env, good, backends.Default().Name()); err != nil {
		t.Fatal(err)
	}
	if !r.Valid || len(r.Attachments) != 1 || r.Attachments[0].VM != "x" || r.Attachments[0].Network != "shared" || r.Networks == 0 {
		t.Errorf("valid files: %+v", r)
	}
}
