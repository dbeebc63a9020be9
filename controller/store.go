package controller

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/vmnetctl/vmnetctl/api"
)

// Files of the state dir.
const (
	networksSnapshotFile = "networks.json"   // the networks.yaml `up` used: {source, data}
	networksYAMLFile     = "networks.yaml"   // the same bytes, for helpers' --networks
	projectsDir          = "projects"        // one <name>.json per project
	runtimeFile          = "runtime.json"    // helpers that run, and what was applied
	controllerLockFile   = "controller.lock" // held by the one controller of this dir
	opsLockFile          = "ops.lock"        // serialises up, down and plan
	socketFile           = "controller.sock" // the daemon API
	controllerLogFile    = "controller.log"  // the background controller's output
	helpersDir           = "helpers"         // <key>.json (ready line) and <key>.log (stderr)
	vmsDir               = "vms"             // vms/<vm>/<index>.sock, owned by the VM's user
	leasesDir            = "leases"          // the DHCP servers' lease files
)

// NetworksSnapshot is the networks.yaml the desired state was resolved against.
type NetworksSnapshot struct {
	Source string `json:"source"`
	Data   []byte `json:"data"`
}

// Load parses the snapshot.
func (n *NetworksSnapshot) Load() (*api.Networks, error) {
	nets, diags := api.LoadNetworks(n.Source, n.Data)
	return nets, diags.Err()
}

// SaveNetworks records the networks.yaml that `up` used.
func (s StateDir) SaveNetworks(snap NetworksSnapshot) error {
	if err := s.WriteFile(networksYAMLFile, snap.Data); err != nil {
		return err
	}
	return s.WriteJSON(networksSnapshotFile, snap)
}

// Networks returns the recorded networks.yaml, or nil when none was recorded.
func (s StateDir) Networks() (*NetworksSnapshot, error) {
	var snap NetworksSnapshot
	found, err := s.ReadJSON(networksSnapshotFile, &snap)
	if err != nil || !found {
		return nil, err
	}
	return &snap, nil
}

// SaveProject adds or replaces a project.
func (s StateDir) SaveProject(p *Project) error {
	if msg := checkProjectName(p.Name); msg != "" {
		return errors.New(msg)
	}
	return s.WriteJSON(filepath.Join(projectsDir, p.Name+".json"), p)
}

// DeleteProject removes a project; removing one that does not exist is fine.
func (s StateDir) DeleteProject(name string) (existed bool, err error) {
	err = os.Remove(s.File(projectsDir, name+".json"))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// Projects returns every project, by name.
func (s StateDir) Projects() ([]*Project, error) {
	entries, err := os.ReadDir(s.File(projectsDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading projects: %w", err)
	}
	var out []*Project
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		p := &Project{}
		if _, err := s.ReadJSON(filepath.Join(projectsDir, e.Name()), p); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b *Project) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// checkProjectName returns why name cannot name a project, or "".
func checkProjectName(name string) string {
	if name == "" || strings.ContainsAny(name, "/\\\x00") || name[0] == '.' || name[0] == '-' || len(name) > 63 {
		return fmt.Sprintf("project name %q: use letters, digits, '-', '_' and '.', not starting with '.' or '-'", name)
	}
	return ""
}

// ProjectName is the default project name for VM files: the VM's name for a
// single lima instance file, else the first file's base name without extension.
func ProjectName(files []*api.VMFile) string {
	if len(files) == 0 {
		return ""
	}
	if len(files) == 1 && files[0].Shape == api.ShapeLima && len(files[0].VMs) == 1 {
		return files[0].VMs[0].Name
	}
	base := filepath.Base(files[0].File)
	return strings.TrimSuffix(base, filepath.Ext(base))
}
