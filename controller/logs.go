package controller

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/vmnetctl/vmnetctl/statedir"
)

// followEvery is how often Logs looks for new lines with follow.
const followEvery = 250 * time.Millisecond

// logSource is one log file and the prefix of its lines.
type logSource struct {
	prefix, path string
	offset       int64
}

// Logs writes to w the log of vm's helpers (each line prefixed with
// "VM/INDEX | "), or without vm the controller's log. With follow it then
// writes new lines as they come until ctx ends; a log that was rotated
// (it shrank) is read again from its start.
func Logs(ctx context.Context, sd statedir.Dir, vm string, follow bool, w io.Writer) error {
	var sources []*logSource
	if vm == "" {
		sources = append(sources, &logSource{path: sd.ControllerLog()})
	} else {
		d, err := AppliedState(sd)
		if err != nil {
			return err
		}
		for _, a := range d.Attachments {
			if a.VM == vm {
				sources = append(sources, &logSource{prefix: a.Key() + " | ", path: sd.HelperLogFile(a.Key())})
			}
		}
		if len(sources) == 0 {
			return fmt.Errorf("VM %q is not up in %s (see `vmnetctl status`)%s", vm, sd.Path, suggestVM(d, vm))
		}
	}
	return tailSources(ctx, sources, w, follow)
}

// tailSources writes what the sources hold, and with follow then what is
// appended to them, every followEvery, until ctx ends.
func tailSources(ctx context.Context, sources []*logSource, w io.Writer, follow bool) error {
	for {
		for _, s := range sources {
			if err := s.copyNew(w); err != nil {
				return err
			}
		}
		if !follow {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(followEvery):
		}
	}
}

// copyNew writes the lines appended to the source's file since the last
// call.
func (s *logSource) copyNew(w io.Writer) error {
	f, err := os.Open(s.path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() < s.offset {
		s.offset = 0 // rotated
	}
	if _, err := f.Seek(s.offset, io.SeekStart); err != nil {
		return err
	}
	r := bufio.NewReader(f)
	for {
		line, err := r.ReadString('\n')
		if len(line) > 0 && line[len(line)-1] == '\n' {
			s.offset += int64(len(line))
			if _, werr := io.WriteString(w, s.prefix+line); werr != nil {
				return werr
			}
		}
		if err != nil { // a partial last line waits for its end
			return nil
		}
	}
}
