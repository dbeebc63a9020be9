package helper

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestListenAs: the socket Prepare makes in the controller is made with
// the VM owner's rights, not root's: it and its lock are the owner's, mode
// 0600; in a folder the owner may not write it fails; a symlink the owner
// planted at the lock's path is not followed.
func TestListenAs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("makes sockets as another user")
	}
	const owner = 65534
	uidOf := func(path string) (int, os.FileMode) {
		t.Helper()
		fi, err := os.Lstat(path)
		if err != nil {
			t.Fatal(err)
		}
		return int(fi.Sys().(*syscall.Stat_t).Uid), fi.Mode().Perm()
	}
	ownersDir := func() string {
		dir := t.TempDir()
		// (The test's own folder lets the owner through, as the state
		// dir and vms/ do.)
		if err := os.Chmod(filepath.Dir(dir), 0o711); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(dir, owner, owner); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	for _, stream := range []bool{false, true} {
		dir := ownersDir()
		sock := filepath.Join(dir, "0.sock")
		lis, err := listenAs(sock, stream, owner, owner)
		if err != nil {
			t.Fatalf("stream %v: %v", stream, err)
		}
		for _, p := range []string{sock, sock + ".lock"} {
			if uid, mode := uidOf(p); uid != owner || mode != 0o600 {
				t.Errorf("stream %v: %s is uid %d's, mode %v; want %d's, 0600", stream, p, uid, mode, owner)
			}
		}
		lis.Close()
	}

	rootsDir := t.TempDir() // root's
	if err := os.Chmod(rootsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	// A helper that stays root makes them as root.
	lis, err := listenAs(filepath.Join(rootsDir, "root.sock"), false, -1, -1)
	if err != nil {
		t.Fatal(err)
	}
	if uid, mode := uidOf(filepath.Join(rootsDir, "root.sock")); uid != 0 || mode != 0o600 {
		t.Errorf("root's socket is uid %d's, mode %v; want 0's, 0600", uid, mode)
	}
	lis.Close()
	if _, err := listenAs(filepath.Join(rootsDir, "0.sock"), false, owner, owner); err == nil {
		t.Errorf("made a socket in a folder uid %d may not write", owner)
	}

	dir := ownersDir()
	target := filepath.Join(t.TempDir(), "planted")
	sock := filepath.Join(dir, "0.sock")
	if err := os.Symlink(target, sock+".lock"); err != nil {
		t.Fatal(err)
	}
	if _, err := listenAs(sock, false, owner, owner); err == nil {
		t.Errorf("followed a symlink at the lock's path")
	}
	if _, err := os.Lstat(target); err == nil {
		t.Errorf("created %s through the symlink at the lock's path", target)
	}
	// And this process's own ids are root's still.
	f, err := os.Create(filepath.Join(t.TempDir(), "mine"))
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if uid, _ := uidOf(f.Name()); uid != 0 {
		t.Errorf("a file made after listenAs is uid %d's", uid)
	}
}
