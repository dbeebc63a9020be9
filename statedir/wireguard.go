package statedir

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/vmnetctl/vmnetctl/wgkey"
)

// wireGuardKeyFile holds this host's WireGuard private key (package
// wgkey), made on the first network whose underlay is encrypted.
const wireGuardKeyFile = "wireguard.key"

// WireGuardKeyFile is this host's WireGuard private key, 0600, kept with
// what outlives a reboot (KeepDir): the key is the host's identity, which
// the other hosts list in networks.yaml.
func (d Dir) WireGuardKeyFile() string { return filepath.Join(d.KeepDir(), wireGuardKeyFile) }

// wireGuardKeyPath is WireGuardKeyFile's rule, for the (canonical) state
// dir dir, the user euid and their home.
func wireGuardKeyPath(dir string, euid int, home string) string {
	return filepath.Join(keepDir(dir, euid, home), wireGuardKeyFile)
}

// PrepareWireGuardKey is WireGuardKeyFile, after moving there a key that
// an earlier vmnetctl kept in a state dir under /run (where it would not
// have outlived the next reboot): the key the other hosts list now. A key
// already in the new place wins and the old one is left alone.
func (d Dir) PrepareWireGuardKey() (string, error) {
	return d.prepareWireGuardKey(d.WireGuardKeyFile())
}

// prepareWireGuardKey is PrepareWireGuardKey with the key's path.
func (d Dir) prepareWireGuardKey(path string) (string, error) {
	old := filepath.Join(d.Path, wireGuardKeyFile)
	if path == old {
		return path, nil
	}
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		return path, nil // there (or unreadable: wgkey says why)
	}
	b, err := os.ReadFile(old)
	if errors.Is(err, fs.ErrNotExist) {
		return path, nil
	}
	if err != nil {
		return "", fmt.Errorf("moving this host's WireGuard key from %s: %w", old, err)
	}
	// A crash leaves either no key there (the old one is still in the
	// state dir) or the whole one; if another process moved it first,
	// its copy stays.
	if err := wgkey.Place(path, b); err != nil {
		return "", fmt.Errorf("moving this host's WireGuard key to %s: %w", path, err)
	}
	os.Remove(old)
	return path, nil
}
