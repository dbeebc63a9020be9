package statedir

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/test/testutil"
)

func TestLockIsExclusive(t *testing.T) {
	s := Dir{Path: t.TempDir()}
	l, err := s.TryLockController()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.TryLockController(); !errors.Is(err, ErrLocked) {
		t.Fatalf("second TryLock: %v, want ErrLocked", err)
	}
	if err := l.Unlock(); err != nil {
		t.Fatal(err)
	}
	l2, err := s.TryLockController()
	if err != nil {
		t.Fatalf("TryLock after Unlock: %v", err)
	}
	l2.Unlock()
}

func TestWriteJSONIsAtomicAndReadable(t *testing.T) {
	s := Dir{Path: t.TempDir()}
	type doc struct{ A int }
	if found, err := s.readJSON("projects/p.json", &doc{}); found || err != nil {
		t.Fatalf("missing file: found=%v err=%v", found, err)
	}
	for i := 1; i <= 3; i++ {
		if err := s.writeJSON("projects/p.json", doc{A: i}); err != nil {
			t.Fatal(err)
		}
	}
	var got doc
	if found, err := s.readJSON("projects/p.json", &got); !found || err != nil || got.A != 3 {
		t.Fatalf("read %+v found=%v err=%v", got, found, err)
	}
	entries, _ := os.ReadDir(s.file("projects"))
	if len(entries) != 1 {
		t.Errorf("temporary files left behind: %v", entries)
	}
}

// A state dir that someone else could change is refused, and nothing in it
// is read or opened through a symbolic link.
func TestUntrustedStateDir(t *testing.T) {
	t.Run("writable by others", func(t *testing.T) {
		d := Dir{Path: filepath.Join(t.TempDir(), "state")}
		if err := os.Mkdir(d.Path, 0o750); err != nil {
			t.Fatal(err)
		}
		l, err := d.LockOps()
		if err != nil {
			t.Fatalf("a private state dir is refused: %v", err) // the control
		}
		l.Unlock()
		os.Chmod(d.Path, 0o777)
		if l, err := d.TryLockController(); err == nil || !strings.Contains(err.Error(), "writable by its group or others") {
			t.Errorf("mode 0777: %v", err)
			if err == nil {
				l.Unlock()
			}
		}
	})
	t.Run("a symbolic link", func(t *testing.T) {
		dir := t.TempDir()
		os.Mkdir(filepath.Join(dir, "real"), 0o750)
		os.Symlink(filepath.Join(dir, "real"), filepath.Join(dir, "state"))
		if _, err := (Dir{Path: filepath.Join(dir, "state")}).TryLockController(); err == nil || !strings.Contains(err.Error(), "symbolic link") {
			t.Errorf("symlinked state dir: %v", err)
		}
	})
	t.Run("another user's", func(t *testing.T) {
		if os.Geteuid() != 0 {
			testutil.RequireRoot(t, "to give the directory away")
		}
		d := Dir{Path: filepath.Join(t.TempDir(), "state")}
		os.Mkdir(d.Path, 0o750)
		os.Chown(d.Path, 65534, 65534)
		if _, err := d.TryLockController(); err == nil || !strings.Contains(err.Error(), "belongs to uid 65534") {
			t.Errorf("a state dir of uid 65534: %v", err)
		}
	})
	t.Run("planted symbolic links", func(t *testing.T) {
		d := Dir{Path: filepath.Join(t.TempDir(), "state")}
		if err := d.Init(); err != nil {
			t.Fatal(err)
		}
		victim := filepath.Join(t.TempDir(), "victim")
		os.WriteFile(victim, []byte(`{"name":"evil"}`), 0o644)
		os.MkdirAll(d.file(projectsDir), 0o750)
		os.Symlink(victim, d.file(projectsDir, "evil.json"))
		if _, err := d.Projects(); err == nil {
			t.Error("a project behind a symbolic link was read")
		}
		os.Symlink(victim, d.file(opsLockFile))
		if _, err := d.LockOps(); err == nil {
			t.Error("a lock behind a symbolic link was opened")
		}
		os.Symlink(victim, d.ControllerLog())
		if f, err := OpenLog(d.ControllerLog()); err == nil {
			f.Close()
			t.Error("a log behind a symbolic link was opened for appending")
		}
		if b, _ := os.ReadFile(victim); string(b) != `{"name":"evil"}` {
			t.Errorf("the link's target changed: %q", b)
		}
	})
}

func TestRotateLog(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "h.log")
	w, err := OpenLog(path) // as a helper's stderr: O_APPEND
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	line := strings.Repeat("x", 99) + "\n"
	for range 20 {
		w.WriteString(line)
	}
	if rotated, err := RotateLog(path, 5000); rotated || err != nil {
		t.Fatalf("a log under its limit was rotated: %v %v", rotated, err) // the control
	}
	for range 40 {
		w.WriteString(line)
	}
	if rotated, err := RotateLog(path, 5000); !rotated || err != nil {
		t.Fatalf("a 6000-byte log with a limit of 5000: rotated %v, %v", rotated, err)
	}
	if b, _ := os.ReadFile(path + ".1"); len(b) != 6000 {
		t.Errorf("the rotated copy has %d bytes, want 6000", len(b))
	}
	w.WriteString("after\n")
	if b, _ := os.ReadFile(path); string(b) != "after\n" {
		t.Errorf("after rotation the log holds %q: the writer did not go on at its start", b)
	}
}
