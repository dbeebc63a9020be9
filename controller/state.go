package controller

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// StateDir is the directory where vmnetctl keeps its state: the projects
// given to `up`, the networks.yaml they were resolved against, leases, helper
// sockets and the controller's lock and API socket.
type StateDir struct {
	Path string
}

// Init creates the directory, private to its owner.
func (s StateDir) Init() error {
	if err := os.MkdirAll(s.Path, 0o750); err != nil {
		return fmt.Errorf("creating state dir: %w", err)
	}
	return nil
}

// File returns the path of a file in the state dir.
func (s StateDir) File(elem ...string) string {
	return filepath.Join(append([]string{s.Path}, elem...)...)
}

// Lock is an exclusive flock on a file of the state dir. The kernel drops it
// when the process dies, so a crash never leaves a stale lock behind.
type Lock struct {
	f *os.File
}

// ErrLocked is returned by TryLock when another process holds the lock.
var ErrLocked = errors.New("locked by another process")

// TryLock takes the lock named name without waiting.
func (s StateDir) TryLock(name string) (*Lock, error) { return s.lock(name, unix.LOCK_EX|unix.LOCK_NB) }

// WaitLock takes the lock named name, waiting for its holder to let go.
func (s StateDir) WaitLock(name string) (*Lock, error) { return s.lock(name, unix.LOCK_EX) }

func (s StateDir) lock(name string, how int) (*Lock, error) {
	if err := s.Init(); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(s.File(name), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening lock: %w", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), how)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s: %w", s.File(name), ErrLocked)
		}
		return nil, fmt.Errorf("locking %s: %w", s.File(name), err)
	}
	return &Lock{f: f}, nil
}

// Unlock releases the lock.
func (l *Lock) Unlock() error { return l.f.Close() }

// WriteFile replaces a file of the state dir atomically: readers see the old
// content or the new, never a part, even if the writer crashes.
func (s StateDir) WriteFile(name string, data []byte) error {
	path := s.File(name)
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// WriteJSON stores v as indented JSON, atomically.
func (s StateDir) WriteJSON(name string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding %s: %w", name, err)
	}
	return s.WriteFile(name, append(data, '\n'))
}

// ReadJSON loads a JSON file of the state dir into v; found is false when the
// file does not exist.
func (s StateDir) ReadJSON(name string, v any) (found bool, err error) {
	data, err := os.ReadFile(s.File(name))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading state: %w", err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return true, fmt.Errorf("reading state %s: %w", s.File(name), err)
	}
	return true, nil
}
