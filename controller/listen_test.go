package controller

import (
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/vmnetctl/vmnetctl/statedir"
)

// TestAPISocketNeverWider: the API socket is 0600 (no --group) once
// listen returns, and while listen runs, under a umask of 0, no socket
// anyone may reach is ever found in the state dir with a wider mode: a
// watcher lists the state dir without pause while listen runs 200 times,
// and any socket it finds, whatever its name, must be 0600 or in a
// directory only its owner may enter.
func TestAPISocketNeverWider(t *testing.T) {
	sd := statedir.Dir{Path: filepath.Join(t.TempDir(), "state")}
	if err := sd.Init(); err != nil {
		t.Fatal(err)
	}
	c, err := New(Options{StateDir: sd, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	old := syscall.Umask(0)
	defer syscall.Umask(old)

	var stop atomic.Bool
	var wider atomic.Value
	var wg sync.WaitGroup
	wg.Go(func() {
		for !stop.Load() {
			filepath.WalkDir(sd.Path, func(p string, d fs.DirEntry, err error) error {
				if err != nil {
					return nil // gone meanwhile
				}
				fi, err := d.Info()
				if err != nil {
					return nil
				}
				if d.IsDir() && p != sd.Path && fi.Mode().Perm()&0o077 == 0 {
					return filepath.SkipDir // private: nobody else reaches inside
				}
				if fi.Mode()&fs.ModeSocket != 0 && fi.Mode().Perm()&^0o600 != 0 {
					wider.Store(p + " " + fi.Mode().String())
				}
				return nil
			})
		}
	})
	for range 200 {
		ln, err := c.listen()
		if err != nil {
			t.Fatal(err)
		}
		fi, err := os.Lstat(sd.APISocket())
		if err != nil || fi.Mode()&fs.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
			t.Fatalf("the API socket after listen: %v, %v", fi.Mode(), err)
		}
		ln.Close()
		os.Remove(sd.APISocket())
	}
	stop.Store(true)
	wg.Wait()
	if w := wider.Load(); w != nil {
		t.Errorf("found a socket with a wider mode: %s", w)
	}
	if left, _ := filepath.Glob(filepath.Join(sd.Path, apiSocketTemp)); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}
