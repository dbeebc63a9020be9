package config

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/vmnetctl/vmnetctl/api"
)

// TestEmbeddedDefaults checks the built-in networks: lima's template's shared
// and host subnets, and user-v2 shown but not managed.
func TestEmbeddedDefaults(t *testing.T) {
	nets, diags := api.LoadNetworks(EmbeddedSource, DefaultNetworks)
	if diags.HasErrors() || len(diags) > 0 {
		t.Fatalf("embedded networks.yaml has diagnostics:\n%v", diags)
	}
	for id, subnet := range map[string]string{"shared": "192.168.105.0/24", "host": "192.168.106.0/24"} {
		n := nets.Get(id)
		if n == nil || n.Subnet.String() != subnet || !n.Managed() {
			t.Errorf("network %s = %+v, want managed with subnet %s", id, n, subnet)
		}
	}
	if n := nets.Get("user-v2"); n == nil || n.Managed() {
		t.Errorf("user-v2 = %+v, want present and unmanaged", n)
	}
}

// TestRepositoryYAML loads every YAML file in config/ and examples/, and every
// ```yaml block in docs/, so that no example can rot. A file or block is read
// as networks.yaml when its name (or the comment on its first line) says
// "networks", else as a VM file; files under examples/broken/ must fail.
func TestRepositoryYAML(t *testing.T) {
	var inputs []struct {
		name, kind string
		data       []byte
		broken     bool
	}
	add := func(name string, data []byte, broken bool) {
		kind := "vms"
		first, _, _ := bytes.Cut(data, []byte("\n"))
		if strings.Contains(filepath.Base(name), "networks") || bytes.Contains(first, []byte("networks.yaml")) {
			kind = "networks"
		}
		inputs = append(inputs, struct {
			name, kind string
			data       []byte
			broken     bool
		}{name, kind, data, broken})
	}
	for _, dir := range []string{"../config", "../examples"} {
		err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(p, ".yaml") {
				return err
			}
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			add(p, data, strings.Contains(p, "/broken/"))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	docs, _ := filepath.Glob("../docs/*.md")
	readme, _ := filepath.Glob("../README.md")
	for _, p := range append(docs, readme...) {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for i, block := range yamlBlocks(data) {
			name := p + "#yaml" + string(rune('1'+i))
			// A block is a vmnetctl input when its first line says which
			// (# networks.yaml, # lima.yaml, # vms.yaml); any other YAML in
			// the docs (a Prometheus config, say) must still parse.
			first, _, _ := bytes.Cut(block, []byte("\n"))
			if !bytes.HasPrefix(first, []byte("# ")) || !bytes.Contains(first, []byte(".yaml")) {
				var v any
				if err := yaml.Unmarshal(block, &v); err != nil {
					t.Errorf("%s: invalid YAML: %v", name, err)
				}
				continue
			}
			add(name, block, bytes.Contains(block, []byte("# broken")))
		}
	}
	if len(inputs) < 6 {
		t.Fatalf("found only %d YAML inputs; is the working directory right?", len(inputs))
	}
	defaults, _ := api.LoadNetworks(EmbeddedSource, DefaultNetworks)
	for _, in := range inputs {
		t.Run(in.name, func(t *testing.T) {
			var diags api.Diagnostics
			if in.kind == "networks" {
				_, diags = api.LoadNetworks(in.name, in.data)
			} else {
				nets := defaults
				// A VM file beside a networks.yaml uses it.
				if data, err := os.ReadFile(filepath.Join(filepath.Dir(in.name), "networks.yaml")); err == nil && !strings.Contains(in.name, "#") {
					nets, _ = api.LoadNetworks("networks.yaml", data)
				}
				vf, d := api.LoadVMFile(in.name, in.data, api.VMFileOptions{Name: "doc"})
				diags = d
				if vf != nil && nets != nil {
					diags = append(diags, api.Resolve(nets, []*api.VMFile{vf})...)
				}
			}
			if in.broken != diags.HasErrors() {
				t.Errorf("broken=%v but errors=%v:\n%v", in.broken, diags.HasErrors(), diags)
			}
		})
	}
}

// yamlBlocks returns the contents of the ```yaml fenced blocks of a Markdown file.
func yamlBlocks(md []byte) [][]byte {
	var blocks [][]byte
	var cur *bytes.Buffer
	sc := bufio.NewScanner(bytes.NewReader(md))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case cur == nil && strings.TrimSpace(line) == "```yaml":
			cur = &bytes.Buffer{}
		case cur != nil && strings.TrimSpace(line) == "```":
			blocks = append(blocks, cur.Bytes())
			cur = nil
		case cur != nil:
			cur.WriteString(line + "\n")
		}
	}
	return blocks
}
