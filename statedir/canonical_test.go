package statedir

import (
	"os"
	"path/filepath"
	"testing"
)

// Two spellings of one directory are one state dir: through a symbolic
// link in its parents, relative, and for a state dir not made yet.
func TestCanonical(t *testing.T) {
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	real := filepath.Join(base, "run")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, filepath.Join(base, "varrun")); err != nil {
		t.Fatal(err)
	}
	t.Chdir(base)
	want := filepath.Join(real, "vmnetctl")
	for _, p := range []string{filepath.Join(base, "varrun", "vmnetctl"), "run/vmnetctl", "varrun/../run/vmnetctl", filepath.Join(real, "vmnetctl") + "/"} {
		if got := Canonical(p); got != want {
			t.Errorf("Canonical(%q) = %q, want %q", p, got, want)
		}
	}
	if err := os.Mkdir(want, 0o700); err != nil {
		t.Fatal(err)
	}
	if got := Canonical(filepath.Join(base, "varrun", "vmnetctl")); got != want {
		t.Errorf("existing: Canonical = %q, want %q", got, want)
	}
}
