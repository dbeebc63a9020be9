package guest

import (
	"fmt"
	"io"
	"sort"
	"strings"
)

// cpioEntry is one member of a newc ("070701") archive, the format the Linux
// kernel unpacks into its initramfs.
type cpioEntry struct {
	Name  string // path without a leading slash
	Mode  uint32 // file type bits and permissions, as in stat(2)
	Data  []byte // file contents or symlink target
	Major uint32 // device numbers for character devices
	Minor uint32
}

const (
	modeDir     = 0o040000
	modeRegular = 0o100000
	modeSymlink = 0o120000
	modeCharDev = 0o020000
)

// writeCPIO writes entries as a newc archive with the trailer. Entries are
// written in the order given; directories must precede their contents.
// Timestamps and owners are zero so that equal inputs give equal bytes.
func writeCPIO(w io.Writer, entries []cpioEntry) error {
	ino := uint32(1)
	for _, e := range entries {
		if err := writeCPIOEntry(w, e, ino); err != nil {
			return err
		}
		ino++
	}
	return writeCPIOEntry(w, cpioEntry{Name: "TRAILER!!!"}, 0)
}

func writeCPIOEntry(w io.Writer, e cpioEntry, ino uint32) error {
	name := strings.TrimPrefix(e.Name, "/")
	nlink := uint32(1)
	if e.Mode&0o170000 == modeDir {
		nlink = 2
	}
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		ino, e.Mode, 0, 0, nlink, 0, len(e.Data), 0, 0, e.Major, e.Minor, len(name)+1, 0)
	buf := make([]byte, 0, len(hdr)+len(name)+8)
	buf = append(buf, hdr...)
	buf = append(buf, name...)
	buf = append(buf, 0)
	buf = pad4(buf)
	if _, err := w.Write(buf); err != nil {
		return err
	}
	if len(e.Data) > 0 {
		if _, err := w.Write(e.Data); err != nil {
			return err
		}
		if n := len(e.Data) % 4; n != 0 {
			if _, err := w.Write(make([]byte, 4-n)); err != nil {
				return err
			}
		}
	}
	return nil
}

func pad4(b []byte) []byte {
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// withParents returns entries preceded by directory entries for every parent
// directory they need that is not already present, sorted by name so that
// parents come first.
func withParents(entries []cpioEntry) []cpioEntry {
	have := map[string]bool{}
	for _, e := range entries {
		if e.Mode&0o170000 == modeDir {
			have[strings.TrimPrefix(e.Name, "/")] = true
		}
	}
	var out []cpioEntry
	for _, e := range entries {
		name := strings.TrimPrefix(e.Name, "/")
		for i := 0; i < len(name); i++ {
			if name[i] == '/' && !have[name[:i]] {
				have[name[:i]] = true
				out = append(out, cpioEntry{Name: name[:i], Mode: modeDir | 0o755})
			}
		}
		out = append(out, e)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
