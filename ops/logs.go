package ops

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/spec"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// followEvery is how often Logs looks for new lines with follow.
const followEvery = 250 * time.Millisecond

// logSource is one log file and the prefix of its lines.
type logSource struct {
	prefix, path string
	offset       int64
	// json: write each line as a LogLine of this source, not prefixed.
	json *LogLine
	// since, if set, drops the lines from before it: a line without a
	// time of its own goes with the line before it (sinceKeeps).
	since      time.Time
	sinceKeeps bool
}

// LogLine is one line of `vmnetctl logs --json`.
type LogLine struct {
	// Time is the line's own time (the controller's lines and the
	// helpers' stats lines carry one); absent when it has none.
	Time *time.Time `json:"time,omitempty"`
	// VM and Index are the helper's attachment (source "helper").
	VM     string `json:"vm,omitempty"`
	Index  *int   `json:"index,omitempty"`
	Source string `json:"source"` // "controller" or "helper"
	Line   string `json:"line"`
}

// LogSourceController and LogSourceHelper are LogLine's sources.
const (
	LogSourceController = "controller"
	LogSourceHelper     = "helper"
)

// lineTime is the time a log line carries: slog's time=... (the
// controller), the time that starts a helper's line (--log-timestamps),
// or a stats line's JSON time (a helper's older lines).
func lineTime(line string) *time.Time {
	if t, _, ok := helperproto.CutLogTime(line); ok {
		return &t
	}
	var s string
	if rest, ok := strings.CutPrefix(line, "time="); ok {
		s, _, _ = strings.Cut(rest, " ")
	} else if js, ok := strings.CutPrefix(line, helperproto.StatsPrefix); ok {
		var v struct {
			Time string `json:"time"`
		}
		json.Unmarshal([]byte(js), &v)
		s = v.Time
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return nil
	}
	return &t
}

// Logs writes to w the log of vm's helpers (each line prefixed with
// "VM/INDEX | "), or without vm the controller's log; with asJSON each
// line as a LogLine (JSON lines). With follow it then writes new lines as
// they come until ctx ends; a log that was rotated (it shrank) is read
// again from its start.
func Logs(ctx context.Context, sd statedir.Dir, vm string, follow, asJSON bool, w io.Writer) error {
	return LogsTail(ctx, sd, vm, TailOptions{Follow: follow, JSON: asJSON}, w)
}

// TailOptions say what of a log `logs` and `events` print: with Tail > 0
// only the last Tail lines there are (then, with Follow, every new one),
// with Since only those from then on (lines that carry their time).
type TailOptions struct {
	Follow, JSON bool
	Tail         int
	Since        time.Time
}

// LogsTail is Logs with TailOptions.
func LogsTail(ctx context.Context, sd statedir.Dir, vm string, o TailOptions, w io.Writer) error {
	asJSON := o.JSON
	var sources []*logSource
	if vm == "" {
		src := &logSource{path: sd.ControllerLog(), since: o.Since}
		if asJSON {
			src.json = &LogLine{Source: LogSourceController}
		}
		sources = append(sources, src)
	} else {
		d, err := spec.AppliedState(sd)
		if err != nil {
			return err
		}
		for _, a := range d.Attachments {
			if a.VM == vm {
				src := &logSource{prefix: a.Key() + " | ", path: sd.HelperLogFile(a.Key()), since: o.Since}
				if asJSON {
					src.json = &LogLine{Source: LogSourceHelper, VM: a.VM, Index: &a.Index}
				}
				sources = append(sources, src)
			}
		}
		if len(sources) == 0 {
			return fmt.Errorf("VM %q is not up in %s (see `vmnetctl status`)%s", vm, sd.Path, spec.SuggestVM(d, vm))
		}
	}
	return tailWith(ctx, sources, w, o, nil)
}

// tailWith is tailSources with o's Tail and Since: what the sources hold
// now goes through a ring of the last Tail lines (keep, if set, says
// whether a line is recent enough), then new lines as they come.
func tailWith(ctx context.Context, sources []*logSource, w io.Writer, o TailOptions, keep func(line []byte) bool) error {
	if o.Tail <= 0 && keep == nil {
		return tailSources(ctx, sources, w, o.Follow)
	}
	ring := &lineRing{max: o.Tail, keep: keep}
	for _, s := range sources {
		if err := s.copyNew(ring); err != nil {
			return err
		}
	}
	for _, l := range ring.lines {
		if _, err := w.Write(l); err != nil {
			return err
		}
	}
	if !o.Follow {
		return nil
	}
	return tailSources(ctx, sources, &lineFilter{w: w, keep: keep}, true)
}

// lineRing keeps the last max lines written to it (all with max 0) that
// keep (if set) keeps.
type lineRing struct {
	max   int
	keep  func([]byte) bool
	lines [][]byte
}

func (r *lineRing) Write(b []byte) (int, error) {
	if r.keep != nil && !r.keep(b) {
		return len(b), nil
	}
	r.lines = append(r.lines, append([]byte(nil), b...))
	if r.max > 0 && len(r.lines) > r.max {
		r.lines = r.lines[1:]
	}
	return len(b), nil
}

// lineFilter passes on the lines keep keeps.
type lineFilter struct {
	w    io.Writer
	keep func([]byte) bool
}

func (f *lineFilter) Write(b []byte) (int, error) {
	if f.keep != nil && !f.keep(b) {
		return len(b), nil
	}
	return f.w.Write(b)
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
			if !s.since.IsZero() {
				if t := lineTime(strings.TrimSuffix(line, "\n")); t != nil {
					s.sinceKeeps = !t.Before(s.since)
				}
				if !s.sinceKeeps {
					continue
				}
			}
			out := s.prefix + line
			if s.json != nil {
				l := *s.json
				l.Line = strings.TrimSuffix(line, "\n")
				l.Time = lineTime(l.Line)
				b, _ := json.Marshal(l)
				out = string(b) + "\n"
			}
			if _, werr := io.WriteString(w, out); werr != nil {
				return werr
			}
		}
		if err != nil { // a partial last line waits for its end
			return nil
		}
	}
}
