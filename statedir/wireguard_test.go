package statedir

import (
	"os"
	"path/filepath"
	"testing"
)

// Clean, once nothing runs, keeps this host's WireGuard key: the other
// hosts list its public key, so a host that comes back must have it.
func TestCleanKeepsWireGuardKey(t *testing.T) {
	d := Dir{Path: t.TempDir()}
	if err := os.WriteFile(d.WireGuardKeyFile(), []byte("key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d.Path, runtimeFile), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := d.Clean(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d.WireGuardKeyFile()); err != nil {
		t.Errorf("Clean removed the WireGuard key: %v", err)
	}
	if _, err := os.Stat(filepath.Join(d.Path, runtimeFile)); err == nil {
		t.Errorf("Clean kept %s", runtimeFile)
	}
}

// The key outlives a reboot: a state dir under /run (a tmpfs) keeps it
// under /var/lib/vmnetctl (root) or ~/.local/share/vmnetctl (a user), at
// the state dir's path; any other in itself.
func TestWireGuardKeyPath(t *testing.T) {
	for _, tc := range []struct {
		dir  string
		euid int
		home string
		want string
	}{
		{Root, 0, "/root", "/var/lib/vmnetctl/run/vmnetctl/wireguard.key"},
		{"/run/other", 0, "/root", "/var/lib/vmnetctl/run/other/wireguard.key"},
		{"/run/user/1000/vmnetctl", 1000, "/home/u", "/home/u/.local/share/vmnetctl/run/user/1000/vmnetctl/wireguard.key"},
		{"/run/user/1000/vmnetctl", 1000, "", "/run/user/1000/vmnetctl/wireguard.key"},
		{"/var/lib/x", 0, "/root", "/var/lib/x/wireguard.key"},
		{"/home/u/.local/state/vmnetctl", 1000, "/home/u", "/home/u/.local/state/vmnetctl/wireguard.key"},
		{"/running", 0, "/root", "/running/wireguard.key"},
		{"/run", 0, "/root", "/run/wireguard.key"},
	} {
		if got := wireGuardKeyPath(tc.dir, tc.euid, tc.home); got != tc.want {
			t.Errorf("wireGuardKeyPath(%q, %d, %q) = %q, want %q", tc.dir, tc.euid, tc.home, got, tc.want)
		}
	}
	// /var/run is /run: one key for both spellings.
	if fi, err := os.Lstat("/var/run"); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		if a, b := (Dir{Path: "/var/run/vmnetctl"}).WireGuardKeyFile(), (Dir{Path: Root}).WireGuardKeyFile(); a != b {
			t.Errorf("/var/run/vmnetctl keeps its key in %s, /run/vmnetctl in %s", a, b)
		}
	}
}

// PrepareWireGuardKey moves a key an earlier vmnetctl kept in a state dir
// under /run to where it outlives a reboot; a key already there wins.
// The state dir is a temporary one standing for /run's (the rule's own
// test is above): old and new are both checked by content.
func TestPrepareWireGuardKeyMoves(t *testing.T) {
	tmp := t.TempDir()
	d := Dir{Path: filepath.Join(tmp, "state")}
	if err := os.MkdirAll(d.Path, 0o700); err != nil {
		t.Fatal(err)
	}
	old := filepath.Join(d.Path, wireGuardKeyFile)
	// Nothing to move: the path, nothing made.
	path, err := d.prepareWireGuardKey(filepath.Join(tmp, "lib", "wireguard.key"))
	if err != nil || path != filepath.Join(tmp, "lib", "wireguard.key") {
		t.Fatalf("prepare with no key = %q, %v", path, err)
	}
	if _, err := os.Stat(path); err == nil {
		t.Errorf("prepare made %s with no key to move", path)
	}
	if err := os.WriteFile(old, []byte("old\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if path, err = d.prepareWireGuardKey(path); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "old\n" {
		t.Errorf("after the move, %s holds %q (%v), want the old key", path, b, err)
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm() != 0o600 {
		t.Errorf("moved key has mode %04o, want 0600", fi.Mode().Perm())
	}
	if _, err := os.Stat(old); err == nil {
		t.Errorf("the old key %s is still there", old)
	}
	// A key in both places: the new one wins, the old one is left.
	if err := os.WriteFile(old, []byte("older\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err = d.prepareWireGuardKey(path); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "old\n" {
		t.Errorf("a second prepare put %q in %s", b, path)
	}
	if _, err := os.Stat(old); err != nil {
		t.Errorf("a second prepare removed %s: %v", old, err)
	}
}
