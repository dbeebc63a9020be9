package dirwatch

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestWatch: a new watch cannot tell until its first take; then it names
// the files created, written, renamed and removed, and nothing else;
// after a take it names none; an overflow, and its folder's removal,
// make it tell nothing until it watches again.
func TestWatch(t *testing.T) {
	dir := t.TempDir()
	w := New(dir)
	defer w.Close()
	names := func() []string { return slices.Sorted(maps.Keys(w.names)) }
	if w.Watching() {
		t.Fatal("a watch watches before its first drain")
	}
	w.Drain()
	if w.Tells() || !w.Moved("anything") {
		t.Fatal("a new watch tells what moved before its first take")
	}
	if !w.Watching() {
		t.Fatal("a drained watch does not watch: it would tell nothing after a take")
	}
	w.Take()
	write := func(name string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("a")
	write("b")
	if err := os.Rename(filepath.Join(dir, "b"), filepath.Join(dir, "c")); err != nil {
		t.Fatal(err)
	}
	w.Drain()
	if !w.Tells() || !slices.Equal(names(), []string{"a", "b", "c"}) {
		t.Fatalf("after writes and a rename: tells %v, names %v", w.Tells(), names())
	}
	if !w.Moved(filepath.Join(dir, "a")) || w.Moved("d") {
		t.Error("Moved does not follow the names")
	}
	if got := slices.Sorted(w.Names()); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("Names: %v", got)
	}
	w.Take()
	w.Drain()
	if n := names(); len(n) != 0 {
		t.Errorf("after a take, with nothing written: %v", n)
	}
	w.Unknown()
	if w.Tells() {
		t.Error("tells after an overflow")
	}
	w.Take()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	w.Drain()
	if w.Tells() || w.Watching() {
		t.Error("tells, or watches, after its folder went")
	}
	w.Take()
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	w.Drain() // watched again: everything moved once
	w.Take()
	write("e")
	w.Drain()
	if !w.Tells() || !slices.Equal(names(), []string{"e"}) {
		t.Errorf("watched again: tells %v, names %v", w.Tells(), names())
	}
}
