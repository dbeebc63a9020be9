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
