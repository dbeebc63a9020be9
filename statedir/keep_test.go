package statedir

import (
	"os"
	"path/filepath"
	"testing"
)

// TestKeepDirRule: a state dir under /run keeps what outlives a reboot
// under /var/lib/vmnetctl (root) or ~/.local/share/vmnetctl (a user) at its
// path below /run; any other state dir keeps it in itself.
func TestKeepDirRule(t *testing.T) {
	for _, tc := range []struct {
		dir  string
		euid int
		home string
		want string
	}{
		{"/run/vmnetctl", 0, "/root", "/var/lib/vmnetctl/run/vmnetctl"},
		{"/run/user/1000/vmnetctl", 1000, "/home/u", "/home/u/.local/share/vmnetctl/run/user/1000/vmnetctl"},
		{"/run/user/1000/vmnetctl", 1000, "", "/run/user/1000/vmnetctl"},
		{"/home/u/.local/state/vmnetctl", 1000, "/home/u", "/home/u/.local/state/vmnetctl"},
		{"/tmp/sd", 0, "/root", "/tmp/sd"},
		{"/run", 0, "/root", "/run"},
		{"/running/x", 0, "/root", "/running/x"},
	} {
		if got := keepDir(tc.dir, tc.euid, tc.home); got != tc.want {
			t.Errorf("keepDir(%q, %d, %q) = %q, want %q", tc.dir, tc.euid, tc.home, got, tc.want)
		}
	}
}

// TestKeptFiles: the projects, the networks snapshot and the leases go to
// KeepDir, the rest (runtime records, the helpers' networks.yaml, locks)
// to the state dir; the helpers' copy of networks.yaml is made again from
// the snapshot when it is missing.
func TestKeptFiles(t *testing.T) {
	tmp := t.TempDir()
	d := Dir{Path: filepath.Join(tmp, "run"), Keep: filepath.Join(tmp, "keep")}
	if err := d.Init(); err != nil {
		t.Fatal(err)
	}
	snap := NetworksSnapshot{Source: "n.yaml", Data: []byte("vmnet: {}\n")}
	if err := d.SaveProjectAndNetworks(snap, &Project{Name: "p"}); err != nil {
		t.Fatal(err)
	}
	if err := d.SaveRuntime(Runtime{}); err != nil {
		t.Fatal(err)
	}
	for path, where := range map[string]string{
		filepath.Join(d.Keep, projectsDir, "p.json"): "keep",
		filepath.Join(d.Keep, networksSnapshotFile):  "keep",
		filepath.Join(d.Path, runtimeFile):           "state dir",
		filepath.Join(d.Path, networksYAMLFile):      "state dir",
		filepath.Join(d.Keep, leasesDir, "x.leases"): "",
		filepath.Join(d.Path, projectsDir, "p.json"): "",
		filepath.Join(d.Keep, runtimeFile):           "",
		filepath.Join(d.Path, networksSnapshotFile):  "",
	} {
		_, err := os.Stat(path)
		if (err == nil) != (where != "") {
			t.Errorf("%s exists: %v", path, err == nil)
		}
	}
	if got := d.LeasesDir(); got != filepath.Join(d.Keep, leasesDir) {
		t.Errorf("LeasesDir() = %s, want it in KeepDir", got)
	}
	// A reboot: the state dir is empty again.
	if err := os.RemoveAll(d.Path); err != nil {
		t.Fatal(err)
	}
	if err := d.Init(); err != nil {
		t.Fatal(err)
	}
	ps, err := d.Projects()
	if err != nil || len(ps) != 1 {
		t.Fatalf("after the state dir was emptied: projects %v, %v", ps, err)
	}
	got, err := d.Networks()
	if err != nil || got == nil {
		t.Fatalf("after the state dir was emptied: networks %v, %v", got, err)
	}
	if err := d.EnsureNetworksYAML(got); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(d.NetworksYAML()); err != nil || string(b) != string(snap.Data) {
		t.Errorf("the helpers' networks.yaml made again: %q, %v", b, err)
	}
}

// TestMoveToKeep: what an earlier vmnetctl kept in a state dir under /run
// moves to KeepDir, whole; what KeepDir already has wins.
func TestMoveToKeep(t *testing.T) {
	tmp := t.TempDir()
	d := Dir{Path: filepath.Join(tmp, "run"), Keep: filepath.Join(tmp, "keep")}
	for name, data := range map[string]string{
		filepath.Join(projectsDir, "a.json"):      `{"name":"a"}`,
		filepath.Join(projectsDir, "b.json"):      `{"name":"b"}`,
		filepath.Join(leasesDir, "n.leases.json"): `[]`,
		networksSnapshotFile:                      `{"source":"old"}`,
	} {
		path := filepath.Join(d.Path, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(d.Keep, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d.Keep, networksSnapshotFile), []byte(`{"source":"new"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := d.Init(); err != nil {
		t.Fatal(err)
	}
	names, err := d.ProjectNames()
	if err != nil || len(names) != 2 {
		t.Errorf("projects after the move: %v, %v", names, err)
	}
	if _, err := os.Stat(filepath.Join(d.Keep, leasesDir, "n.leases.json")); err != nil {
		t.Errorf("the leases were not moved: %v", err)
	}
	if snap, err := d.Networks(); err != nil || snap.Source != "new" {
		t.Errorf("the snapshot KeepDir had: %+v, %v; want it kept", snap, err)
	}
	for _, name := range []string{projectsDir, leasesDir} {
		if _, err := os.Stat(filepath.Join(d.Path, name)); err == nil {
			t.Errorf("%s is still in the state dir", name)
		}
	}
}
