package helperproto

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/dirwatch"
)

// TestWriteShapingsUnchangedUnseen: writing a shaping file what it holds
// already leaves nothing a watch of its directory takes for a write, so
// that the controller's full pass, which reads only the shaping files
// its watch saw written, does not read it again and again; a change is
// seen.
func TestWriteShapingsUnchangedUnseen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "a.0.shaping")
	s := Shapings{ToVM: Shaping{Delay: 5 * time.Millisecond}}
	if _, err := WriteShapings(path, s); err != nil {
		t.Fatal(err)
	}
	w := dirwatch.New(dir)
	defer w.Close()
	w.Drain()
	w.Take()
	for range 2 {
		if changed, err := WriteShapings(path, s); err != nil || changed {
			t.Fatalf("the same shaping again: changed %v, %v", changed, err)
		}
	}
	if changed, err := WriteShapings(filepath.Join(dir, "none.shaping"), Shapings{}); err != nil || changed {
		t.Fatalf("no shaping where no file is: changed %v, %v", changed, err)
	}
	w.Drain()
	if !w.Tells() || w.Moved(path) {
		t.Errorf("a watch takes an unchanged shaping file for written (it tells: %v)", w.Tells())
	}
	if _, err := os.Stat(filepath.Join(dir, "none.shaping")); !os.IsNotExist(err) {
		t.Errorf("an empty shaping made a file: %v", err)
	}
	if changed, err := WriteShapings(path, Shapings{}); err != nil || !changed {
		t.Fatalf("the shaping cleared: changed %v, %v", changed, err)
	}
	w.Drain()
	if !w.Moved(path) {
		t.Error("a watch did not see the shaping file written")
	}
}
