package ops

import (
	"fmt"
	"slices"
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

// TestValidateBrokenNetworksHideLittle: an error in one network of
// networks.yaml hides only what depends on it: a VM file's entry on a
// network that is not defined anywhere is reported all the same, and one
// on the broken network is not called undefined.
func TestValidateBrokenNetworksHideLittle(t *testing.T) {
	env := Env{StateDir: statedir.Dir{Path: t.TempDir()}}
	in := &Input{
		Networks: statedir.NetworksSnapshot{Source: "n.yaml", Data: []byte("vmnet:\n  shared:\n    subnet: 192.168.105.0/24\n  broken:\n    mode: hostt\n")},
		Files:    []statedir.ProjectFile{{Path: "v.yaml", Data: []byte("vms:\n  x:\n    networks:\n      - vmnet: shraed\n      - vmnet: broken\n      - vmnet: shared\n")}},
	}
	r, err := ValidateReport(env, in, backends.Default().Name())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range r.Problems {
		got = append(got, fmt.Sprintf("%s:%d", p.File, p.Line))
	}
	if want := []string{"n.yaml:5", "v.yaml:4"}; !slices.Equal(got, want) {
		t.Errorf("problems at %v, want %v (the bad mode, the undefined shraed): %+v", got, want, r.Problems)
	}
}
