package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

// TestWrite: a file is replaced whole with its mode, in a directory made
// with its own; nothing is left beside it; with Keep, the first file
// stays; Create's file takes more after the data; NoSync replaces it as
// Write does.
func TestWrite(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "sub")
	path := filepath.Join(dir, "f")
	read := func() string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if err := Write(path, []byte("one"), Options{Perm: 0o644, DirPerm: 0o750}); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, []byte("two"), Options{Perm: 0o644}); err != nil {
		t.Fatal(err)
	}
	if got := read(); got != "two" {
		t.Errorf("after two writes: %q, want %q", got, "two")
	}
	for p, want := range map[string]os.FileMode{path: 0o644, dir: 0o750 | os.ModeDir} {
		if fi, err := os.Stat(p); err != nil || fi.Mode() != want {
			t.Errorf("%s: mode %v (%v), want %v", p, fi.Mode(), err, want)
		}
	}
	if err := Write(path, []byte("three"), Options{Keep: true}); err != nil {
		t.Fatal(err)
	}
	if got := read(); got != "two" {
		t.Errorf("Keep replaced the file: %q", got)
	}
	f, err := Create(path, []byte("four"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("+more"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if got := read(); got != "four+more" {
		t.Errorf("Create, then a write: %q, want %q", got, "four+more")
	}
	if fi, _ := os.Stat(path); fi.Mode() != 0o600 {
		t.Errorf("default mode %v, want 0600", fi.Mode())
	}
	if err := Write(path, []byte("five"), Options{NoSync: true}); err != nil {
		t.Fatal(err)
	}
	if got := read(); got != "five" {
		t.Errorf("NoSync: %q, want %q", got, "five")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("left beside the file: %v", ents)
	}
}
