package statedir

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/vmnetctl/vmnetctl/atomicfile"
)

// What must outlive a reboot: the projects, the networks.yaml they were
// resolved against (networks.json), the DHCP servers' leases and this
// host's WireGuard key. A state dir under volatileRoot (a tmpfs: root's
// default, /run/vmnetctl, and $XDG_RUNTIME_DIR's) keeps them under
// /var/lib/vmnetctl (root) or ~/.local/share/vmnetctl (a user) instead,
// at the state dir's path below /run (/run/vmnetctl:
// /var/lib/vmnetctl/run/vmnetctl); any other state dir
// keeps them in itself. So a host that reboots finds its projects again,
// and the controller the service starts at boot brings their networks
// and helpers back (docs/controller.md, "Reboots").
const (
	volatileRoot       = "/run"
	rootPersistentRoot = "/var/lib/vmnetctl"
)

// kept are the files and folders of the state dir that live in KeepDir.
var kept = []string{projectsDir, networksSnapshotFile, leasesDir}

// isKept tells whether name (a path relative to the state dir) is kept.
func isKept(name string) bool {
	first, _, _ := strings.Cut(filepath.ToSlash(name), "/")
	for _, k := range kept {
		if first == k {
			return true
		}
	}
	return false
}

// KeepDir is where the state dir keeps what must outlive a reboot: Keep if
// set, else under /var/lib/vmnetctl (root) or ~/.local/share/vmnetctl
// (another user) for a state dir under /run, else the state dir itself.
func (d Dir) KeepDir() string {
	if d.Keep != "" {
		return d.Keep
	}
	home, _ := os.UserHomeDir()
	return keepDir(Canonical(d.Path), os.Geteuid(), home)
}

// keepDir is KeepDir's rule, for the (canonical) state dir dir, the user
// euid and their home.
func keepDir(dir string, euid int, home string) string {
	rel, err := filepath.Rel(volatileRoot, dir)
	if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		return dir
	}
	base := rootPersistentRoot
	if euid != 0 {
		if home == "" {
			return dir // nowhere better
		}
		// Not under ~/.local/state/vmnetctl, the user's default state
		// dir without $XDG_RUNTIME_DIR, whose cleanup would remove it.
		base = filepath.Join(home, ".local", "share", "vmnetctl")
	}
	return filepath.Join(base, volatileRoot, rel)
}

// New is the state dir at path (canonical), with its KeepDir worked out
// once.
func New(path string) Dir {
	d := Dir{Path: Canonical(path)}
	d.Keep = d.KeepDir()
	return d
}

// moveToKeep moves what an earlier vmnetctl kept in the state dir itself
// (a state dir under /run: lost at the next reboot) to KeepDir, file by
// file; a file KeepDir has already wins. Each file appears whole or not at
// all, and the old ones go once all are copied: a crash leaves them in
// place, and the move is made again.
func (d Dir) moveToKeep() error {
	keep := d.KeepDir()
	if keep == d.Path {
		return nil
	}
	for _, name := range kept {
		old := filepath.Join(d.Path, name)
		if _, err := os.Lstat(old); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		err := filepath.WalkDir(old, func(path string, e fs.DirEntry, err error) error {
			if err != nil || !e.Type().IsRegular() {
				return err // (folders are made with their files; nothing else is ours)
			}
			rel, _ := filepath.Rel(d.Path, path)
			return copyFile(path, filepath.Join(keep, rel))
		})
		if err != nil {
			return fmt.Errorf("moving %s to %s: %w", old, keep, err)
		}
		if err := os.RemoveAll(old); err != nil {
			return err
		}
	}
	return nil
}

// copyFile copies src to dst, made under a temporary name and renamed;
// a dst already there is kept.
func copyFile(src, dst string) error {
	b, err := readNoFollow(src)
	if err != nil {
		return err
	}
	fi, err := os.Lstat(src)
	if err != nil {
		return err
	}
	return atomicfile.Write(dst, b, atomicfile.Options{DirPerm: 0o750, Perm: fi.Mode().Perm(), Keep: true})
}
