// Package atomicfile writes files so that a reader, or the next run after
// a crash, finds the old content or the new, never a part of either.
package atomicfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
)

// Options say how Write and Create place a file.
type Options struct {
	// Perm is the file's mode; 0 means 0600.
	Perm fs.FileMode
	// DirPerm is the mode of the directory made for it if missing; 0
	// means 0700.
	DirPerm fs.FileMode
	// Keep leaves a file already at the path as it is, without error:
	// of two processes placing one at once the first wins (a key made
	// once). Else the new content replaces the old.
	Keep bool
	// NoSync places the file as atomically (a reader, or the writer's
	// successor after a crash of the process, finds the old content or
	// the new) but syncs neither it nor its directory: for a record of
	// running processes, which a power loss ends anyway. After one the
	// file may be missing, old or empty, and its reader must take an
	// unreadable one for none. A sync costs milliseconds, and a
	// controller writes such a record on every attach.
	NoSync bool
}

// Write puts data at path: written to a temporary file beside it, synced,
// then renamed (or linked, with Keep) into place, and the directory synced
// (neither synced with NoSync).
func Write(path string, data []byte, o Options) error {
	f, err := Create(path, data, o)
	if err != nil {
		return err
	}
	return f.Close()
}

// WriteFunc is Write of what write writes to the temporary file: a
// large file written in parts, never whole in memory.
func WriteFunc(path string, o Options, write func(*os.File) error) error {
	f, err := create(path, o, write)
	if err != nil {
		return err
	}
	return f.Close()
}

// Create is Write that returns the file placed, open for writing after
// data (a journal that goes on growing); the caller closes it.
func Create(path string, data []byte, o Options) (*os.File, error) {
	return create(path, o, func(f *os.File) error {
		_, err := f.Write(data)
		return err
	})
}

func create(path string, o Options, write func(*os.File) error) (*os.File, error) {
	if o.Perm == 0 {
		o.Perm = 0o600
	}
	if o.DirPerm == 0 {
		o.DirPerm = 0o700
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, o.DirPerm); err != nil {
		return nil, err
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name()) // fails harmlessly once renamed
	fail := func(err error) (*os.File, error) {
		tmp.Close()
		return nil, err
	}
	if err := write(tmp); err != nil {
		return fail(err)
	}
	if err := tmp.Chmod(o.Perm); err != nil {
		return fail(err)
	}
	if !o.NoSync {
		if err := tmp.Sync(); err != nil {
			return fail(err)
		}
	}
	if o.Keep {
		// A link fails on an existing file, where a rename replaces it.
		if err := os.Link(tmp.Name(), path); err != nil && !errors.Is(err, fs.ErrExist) {
			return fail(err)
		}
	} else if err := os.Rename(tmp.Name(), path); err != nil {
		return fail(err)
	}
	if o.NoSync {
		return tmp, nil
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return tmp, nil
}
