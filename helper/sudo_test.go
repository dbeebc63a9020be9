package helper

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/test/testutil"
)

func TestSudoChecks(t *testing.T) {
	testutil.RequireRoot(t, "checks what a helper run as root through sudo refuses")
	t.Setenv("SUDO_UID", "65534")
	t.Setenv("SUDO_GID", "65534")
	t.Setenv("VMNETCTL_NETWORKS", "")
	dir := t.TempDir()
	// The user may reach it (t.TempDir's are 0700).
	os.Chmod(dir, 0o755)
	os.Chmod(filepath.Dir(dir), 0o755)
	public := filepath.Join(dir, "public.yaml")
	secret := filepath.Join(dir, "secret.yaml")
	users := filepath.Join(dir, "users.yaml")
	os.WriteFile(public, []byte("networks: {}\n"), 0o644)
	os.WriteFile(secret, []byte("networks: {}\n"), 0o600)
	os.WriteFile(users, []byte("networks: {}\n"), 0o644)
	os.Chown(users, 65534, 65534)
	open := filepath.Join(dir, "open")
	os.Mkdir(open, 0o777)
	os.Chmod(open, 0o777) // (past the umask)
	inOpen := filepath.Join(open, "networks.yaml")
	os.WriteFile(inOpen, []byte("networks: {}\n"), 0o644)
	closed := filepath.Join(dir, "closed")
	os.Mkdir(closed, 0o700)
	inClosed := filepath.Join(closed, "networks.yaml")
	os.WriteFile(inClosed, []byte("networks: {}\n"), 0o644)
	for _, tc := range []struct {
		name     string
		f        Flags
		refusing string // "" when allowed
	}{
		{"the invoking user's ids", Flags{UID: 65534, GID: 65534}, ""},
		{"root's uid", Flags{UID: 0, GID: 65534}, "--uid 0"},
		{"no privilege drop", Flags{UID: -1, GID: -1}, "--uid -1"},
		{"another group", Flags{UID: 65534, GID: 0}, "--gid 0"},
		{"root's networks.yaml the user may read", Flags{UID: 65534, GID: 65534, NetworksFile: public}, ""},
		{"a networks.yaml only root may read", Flags{UID: 65534, GID: 65534, NetworksFile: secret}, "cannot read it"},
		{"the user's own networks.yaml", Flags{UID: 65534, GID: 65534, NetworksFile: users}, "that is root's"},
		{"root's, in a directory others may write", Flags{UID: 65534, GID: 65534, NetworksFile: inOpen}, "is not"},
		{"root's, in a directory the user cannot reach", Flags{UID: 65534, GID: 65534, NetworksFile: inClosed}, "cannot reach it"},
		{"another state dir", Flags{UID: 65534, GID: 65534, StateDir: "/etc/vmnetctl"}, "--state-dir"},
		{"a stats file (root would truncate it)", Flags{UID: 65534, GID: 65534, StatsFile: "/etc/passwd"}, "--stats-file /etc/passwd: run through sudo"},
		{"a shaping file (root would read it)", Flags{UID: 65534, GID: 65534, ShapingFile: "/etc/shadow"}, "--shaping-file /etc/shadow: run through sudo"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.f.checkSudo()
			switch {
			case tc.refusing == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.refusing != "" && (err == nil || !strings.Contains(err.Error(), tc.refusing)):
				t.Errorf("got %v, want a refusal naming %q", err, tc.refusing)
			}
		})
	}
	t.Run("not through sudo", func(t *testing.T) {
		t.Setenv("SUDO_UID", "")
		if err := (&Flags{UID: 0, NetworksFile: secret}).checkSudo(); err != nil {
			t.Errorf("root without sudo is refused: %v", err)
		}
	})
}

// TestSudoSocketPath: under sudo, --socket must be a path the invoking
// user could create: `vmnetctl helper --socket` over a root-owned file
// refuses before touching it (the file is intact), as do a directory they
// cannot write, a root-owned lock beside the socket and a file of theirs
// that is not a socket; a new path, or their own stale socket, in their
// own directory is fine.
func TestSudoSocketPath(t *testing.T) {
	testutil.RequireRoot(t, "checks what a helper run as root through sudo refuses")
	t.Setenv("SUDO_UID", "65534")
	t.Setenv("SUDO_GID", "65534")
	t.Setenv("VMNETCTL_NETWORKS", "")
	base := t.TempDir()
	os.Chmod(base, 0o755) // the user may search it, not write it
	mine := filepath.Join(base, "mine")
	os.Mkdir(mine, 0o755)
	os.Chown(mine, 65534, 65534)

	rootFile := filepath.Join(mine, "precious")
	os.WriteFile(rootFile, []byte("root's\n"), 0o600)
	err := Main(context.Background(), Flags{Socket: rootFile, UID: 65534, GID: 65534}, Streams{In: strings.NewReader(""), Out: &bytes.Buffer{}, Err: &bytes.Buffer{}})
	if err == nil || !strings.Contains(err.Error(), "does not belong to the user who ran sudo") {
		t.Errorf("--socket over a root-owned file: %v", err)
	}
	if b, err := os.ReadFile(rootFile); err != nil || string(b) != "root's\n" {
		t.Errorf("the root-owned file after the refusal: %q, %v", b, err)
	}
	if _, err := os.Lstat(rootFile + ".lock"); err == nil {
		t.Errorf("a lock was created beside it")
	}

	stale := filepath.Join(mine, "stale.sock")
	ln, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: stale, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	ln.Close() // a datagram socket's path stays
	os.Chown(stale, 65534, 65534)
	theirs := filepath.Join(mine, "theirs")
	os.WriteFile(theirs, nil, 0o600)
	os.Chown(theirs, 65534, 65534)
	locked := filepath.Join(mine, "locked.sock")
	os.WriteFile(locked+".lock", nil, 0o600)

	for _, tc := range []struct {
		name, path, refusing string // refusing: "" when allowed
	}{
		{"a new path in their directory", filepath.Join(mine, "vm.sock"), ""},
		{"their stale socket", stale, ""},
		{"a directory they cannot write", filepath.Join(base, "vm.sock"), "cannot create files in"},
		{"a root-owned file", rootFile, "does not belong"},
		{"a root-owned lock", locked, "does not belong"},
		{"their file that is not a socket", theirs, "is not a socket"},
		{"a missing directory", filepath.Join(mine, "nope", "vm.sock"), "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := (&Flags{UID: 65534, GID: 65534, Socket: tc.path}).checkSudo()
			switch {
			case tc.refusing == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.refusing != "" && (err == nil || !strings.Contains(err.Error(), tc.refusing)):
				t.Errorf("got %v, want a refusal saying %q", err, tc.refusing)
			}
		})
	}
}
