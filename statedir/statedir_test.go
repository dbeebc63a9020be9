package statedir

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/procid"
	"github.com/vmnetctl/vmnetctl/test/testutil"
	"golang.org/x/sys/unix"
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

// TestUntrustedStateFiles: a file in the state dir that its group or
// others may write, that belongs to another user, or that is not a regular
// file is refused, by fstat after opening it, whether read (runtime.json, a
// project), locked, appended to (a log) or rotated; the same file made
// private again is used.
func TestUntrustedStateFiles(t *testing.T) {
	d := Dir{Path: filepath.Join(t.TempDir(), "state")}
	if err := d.Init(); err != nil {
		t.Fatal(err)
	}
	if err := d.SaveRuntime(Runtime{}); err != nil {
		t.Fatal(err)
	}
	if err := d.SaveProject(&Project{Name: "p"}); err != nil {
		t.Fatal(err)
	}
	l, err := d.LockOps()
	if err != nil {
		t.Fatal(err)
	}
	l.Unlock()
	f, err := OpenLog(d.ControllerLog())
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	uses := map[string]struct {
		path string
		use  func() error
	}{
		"runtime.json": {d.file(runtimeFile), func() error { _, _, err := d.LoadRuntime(); return err }},
		"a project":    {d.file(projectsDir, "p.json"), func() error { _, err := d.Projects(); return err }},
		"the ops lock": {d.file(opsLockFile), func() error {
			l, err := d.LockOps()
			if err == nil {
				l.Unlock()
			}
			return err
		}},
		"a log": {d.ControllerLog(), func() error {
			f, err := OpenLog(d.ControllerLog())
			if err == nil {
				f.Close()
			}
			return err
		}},
		"a log to rotate": {d.ControllerLog(), func() error { _, err := RotateLog(d.ControllerLog(), 0); return err }},
	}
	type change struct {
		name, refusal string
		make, undo    func(path string)
		root          bool
	}
	changes := []change{
		{"writable by others", "writable by its group or others",
			func(p string) { os.Chmod(p, 0o606) }, func(p string) { os.Chmod(p, 0o600) }, false},
		{"writable by its group", "writable by its group or others",
			func(p string) { os.Chmod(p, 0o620) }, func(p string) { os.Chmod(p, 0o600) }, false},
		{"another user's", "belongs to uid 65534",
			func(p string) { os.Chown(p, 65534, 65534) }, func(p string) { os.Chown(p, os.Geteuid(), os.Getegid()) }, true},
	}
	for name, u := range uses {
		for _, c := range changes {
			t.Run(name+" "+c.name, func(t *testing.T) {
				if c.root && os.Geteuid() != 0 {
					testutil.RequireRoot(t, "to give a file away")
				}
				if err := u.use(); err != nil {
					t.Fatalf("before: %v", err) // the control
				}
				c.make(u.path)
				defer c.undo(u.path)
				if err := u.use(); err == nil || !strings.Contains(err.Error(), c.refusal) || !strings.Contains(err.Error(), u.path) {
					t.Errorf("got %v, want a refusal naming %s and saying %q", err, u.path, c.refusal)
				}
			})
		}
	}
	t.Run("not a regular file", func(t *testing.T) {
		os.Remove(d.file(runtimeFile))
		if err := syscall.Mkfifo(d.file(runtimeFile), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, _, err := d.LoadRuntime(); err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("a FIFO as runtime.json: %v", err)
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

// A controller that found no project removes the runtime files only if no
// project is recorded when it does, under the lock that saving a project
// with its networks takes: an `up` saving meanwhile keeps its networks.yaml.
func TestRemoveRuntimeIfNoProjects(t *testing.T) {
	d := Dir{Path: filepath.Join(t.TempDir(), "state")}
	snap := NetworksSnapshot{Source: "networks.yaml", Data: []byte("networks: {}\n")}
	// Nothing recorded: removed.
	if err := d.SaveNetworks(snap); err != nil {
		t.Fatal(err)
	}
	if removed, err := d.RemoveRuntimeIfNoProjects(); !removed || err != nil {
		t.Fatalf("no project: removed %v, %v", removed, err)
	}
	if _, err := os.Stat(d.NetworksYAML()); !os.IsNotExist(err) {
		t.Fatalf("networks.yaml after the removal: %v", err)
	}
	// An up in the middle of saving (it holds the lock): the removal
	// waits, then finds the project and keeps its files.
	l, err := d.lock(projectsLockFile, unix.LOCK_EX)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		removed bool
		err     error
	}
	if err := d.SaveNetworks(snap); err != nil {
		t.Fatal(err)
	}
	done := make(chan result, 1)
	go func() {
		removed, err := d.RemoveRuntimeIfNoProjects()
		done <- result{removed, err}
	}()
	select {
	case r := <-done:
		t.Fatalf("the removal did not wait for the lock: removed %v, %v", r.removed, r.err)
	case <-time.After(100 * time.Millisecond):
	}
	if err := d.SaveProject(&Project{Name: "default"}); err != nil {
		t.Fatal(err)
	}
	l.Unlock()
	if r := <-done; r.removed || r.err != nil {
		t.Fatalf("with a project saved meanwhile: removed %v, %v", r.removed, r.err)
	}
	if _, err := os.Stat(d.NetworksYAML()); err != nil {
		t.Fatalf("the networks.yaml up saved is gone: %v", err)
	}
	// SaveProjectAndNetworks takes the same lock.
	l, err = d.lock(projectsLockFile, unix.LOCK_EX|unix.LOCK_NB)
	if err != nil {
		t.Fatal(err)
	}
	saved := make(chan error, 1)
	go func() { saved <- d.SaveProjectAndNetworks(snap, &Project{Name: "other"}) }()
	select {
	case err := <-saved:
		t.Fatalf("SaveProjectAndNetworks did not wait for the lock: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	l.Unlock()
	if err := <-saved; err != nil {
		t.Fatal(err)
	}
}

// TestDeleteProjectHeldBy: a project is dropped for its dead holder only
// if that process still holds it: one saved since by another process (a
// `vmnetctl run` started again) stays.
func TestDeleteProjectHeldBy(t *testing.T) {
	d := Dir{Path: filepath.Join(t.TempDir(), "state")}
	dead := procid.Identity{PID: 100, StartTime: 1}
	again := procid.Identity{PID: 101, StartTime: 2}
	if err := d.SaveProject(&Project{Name: "run-vm", Holder: &again}); err != nil {
		t.Fatal(err)
	}
	if dropped, err := d.DeleteProjectHeldBy("run-vm", dead); dropped || err != nil {
		t.Errorf("the new holder's project was dropped for the dead one: %v, %v", dropped, err)
	}
	if ps, _ := d.Projects(); len(ps) != 1 {
		t.Fatalf("projects: %d, want the new holder's", len(ps))
	}
	if dropped, err := d.DeleteProjectHeldBy("run-vm", again); !dropped || err != nil {
		t.Errorf("its own holder's: %v, %v", dropped, err)
	}
	if dropped, err := d.DeleteProjectHeldBy("run-vm", again); dropped || err != nil {
		t.Errorf("a project that is gone: %v, %v", dropped, err)
	}
}

// TestProjectNameBytes: a project name is valid UTF-8 without control
// characters (it is a metric label, which invalid UTF-8 made fail every
// scrape, and it is printed to terminals).
func TestProjectNameBytes(t *testing.T) {
	d := Dir{Path: filepath.Join(t.TempDir(), "state")}
	for _, name := range []string{"\xff", "a\x1b]52;c;eA==\a", "a\nb"} {
		if err := d.SaveProject(&Project{Name: name}); err == nil {
			t.Errorf("project name %q accepted", name)
		}
	}
	if err := d.SaveProject(&Project{Name: "my vms"}); err != nil {
		t.Errorf("a name with a space (a file's base name): %v", err)
	}
}

// TestRuntimeWriterSkips: the same runtime state is not written again
// (the file is the one written before); a change is, and so is the same
// state once the file was removed.
func TestRuntimeWriterSkips(t *testing.T) {
	d := Dir{Path: filepath.Join(t.TempDir(), "state")}
	if err := d.Init(); err != nil {
		t.Fatal(err)
	}
	stat := func() os.FileInfo {
		fi, err := os.Stat(d.file(runtimeFile))
		if err != nil {
			t.Fatal(err)
		}
		return fi
	}
	rt := Runtime{Helpers: []HelperRecord{{Key: "p/a/0"}}}
	var w RuntimeWriter
	if err := w.Save(d, rt); err != nil {
		t.Fatal(err)
	}
	first := stat()
	if err := w.Save(d, rt); err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(first, stat()) {
		t.Error("the same state was written again")
	}
	rt.Helpers = append(rt.Helpers, HelperRecord{Key: "p/b/0"})
	if err := w.Save(d, rt); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := d.LoadRuntime(); len(got.Helpers) != 2 {
		t.Errorf("after a change, runtime.json has %d helpers, want 2", len(got.Helpers))
	}
	os.Remove(d.file(runtimeFile))
	if err := w.Save(d, rt); err != nil {
		t.Fatal(err)
	}
	if !d.HasRuntime() {
		t.Error("the same state was not written again once runtime.json was removed")
	}
}

// TestSaveNetworksUnchanged: saving the networks of record again writes
// neither file (an `up` of one VM more syncs nothing), but puts a missing
// networks.yaml back and makes one left 0600 readable by all; other
// bytes, or the same file from elsewhere, are written.
func TestSaveNetworksUnchanged(t *testing.T) {
	d := Dir{Path: filepath.Join(t.TempDir(), "state")}
	snap := NetworksSnapshot{Source: "networks.yaml", Data: []byte("networks: {}\n"), Abs: "/a/networks.yaml"}
	if err := d.SaveNetworks(snap); err != nil {
		t.Fatal(err)
	}
	old := time.Unix(1, 0)
	files := []string{d.NetworksYAML(), d.file(networksSnapshotFile)}
	for _, f := range files {
		os.Chtimes(f, old, old)
	}
	if err := d.SaveNetworks(snap); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if fi, err := os.Stat(f); err != nil || !fi.ModTime().Equal(old) {
			t.Errorf("%s was written again for the same networks (%v)", f, err)
		}
	}
	os.Remove(d.NetworksYAML())
	if err := d.SaveNetworks(snap); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(d.NetworksYAML()); err != nil || string(b) != string(snap.Data) {
		t.Errorf("a missing networks.yaml was not put back: %q, %v", b, err)
	}
	// Left 0600 (a crash before its chmod): readable by all again.
	os.Chmod(d.NetworksYAML(), 0o600)
	if err := d.SaveNetworks(snap); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(d.NetworksYAML()); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("networks.yaml left %v (%v), want 0644", fi.Mode(), err)
	}
	for _, other := range []NetworksSnapshot{
		{Source: snap.Source, Data: []byte("networks: {a: {}}\n"), Abs: snap.Abs},
		{Source: snap.Source, Data: []byte("networks: {a: {}}\n"), Abs: "/b/networks.yaml"},
	} {
		if err := d.SaveNetworks(other); err != nil {
			t.Fatal(err)
		}
		if got, err := d.Networks(); err != nil || got.Abs != other.Abs || string(got.Data) != string(other.Data) {
			t.Errorf("saving %+v: recorded %+v, %v", other, got, err)
		}
	}
}
