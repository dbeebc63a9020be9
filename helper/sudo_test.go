package helper

import (
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
	public := filepath.Join(dir, "public.yaml")
	secret := filepath.Join(dir, "secret.yaml")
	os.WriteFile(public, []byte("networks: {}\n"), 0o644)
	os.WriteFile(secret, []byte("networks: {}\n"), 0o600)
	for _, tc := range []struct {
		name     string
		f        Flags
		refusing string // "" when allowed
	}{
		{"the invoking user's ids", Flags{UID: 65534, GID: 65534}, ""},
		{"root's uid", Flags{UID: 0, GID: 65534}, "--uid 0"},
		{"no privilege drop", Flags{UID: -1, GID: -1}, "--uid -1"},
		{"another group", Flags{UID: 65534, GID: 0}, "--gid 0"},
		{"a networks.yaml the user may read", Flags{UID: 65534, GID: 65534, NetworksFile: public}, ""},
		{"a networks.yaml only root may read", Flags{UID: 65534, GID: 65534, NetworksFile: secret}, "cannot read it"},
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
