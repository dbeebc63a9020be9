package controller

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/dirwatch"
	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// TestLogCheckWatched: with the helpers' directory watched, the log check
// and a scrape look only at the files a write named. A helper whose files
// are elsewhere (no event comes) is not looked at again once seen, while
// one in the directory is read after every write; when the watch cannot
// tell (its queue overflowed, the directory went), every file is looked
// at again. A status reads what the watch named and the files it cannot
// watch.
func TestLogCheckWatched(t *testing.T) {
	dir := t.TempDir()
	sd := statedir.Dir{Path: dir}
	if err := os.MkdirAll(sd.HelpersDir(), 0o750); err != nil {
		t.Fatal(err)
	}
	c := &Controller{sd: sd, log: slog.New(slog.DiscardHandler), watch: dirwatch.New(sd.HelpersDir())}
	defer c.watch.Close()
	in := &helperProc{logPath: filepath.Join(sd.HelpersDir(), "a.0.log"), statsPath: filepath.Join(sd.HelpersDir(), "a.0.stats")}
	out := &helperProc{logPath: filepath.Join(dir, "b.log"), statsPath: filepath.Join(dir, "b.stats")}
	c.helpers = map[string]*helperProc{"a/0": in, "b/0": out}
	write := func(h *helperProc, packets uint64) {
		t.Helper()
		s := helperproto.Stats{Time: time.Now(), VM: helperproto.Counters{Packets: packets}}
		if err := os.WriteFile(h.statsPath, []byte(helperproto.FormatStatsLine(s)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := os.OpenFile(h.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString("INFO  [main] a line\n")
		f.Close()
	}
	check := func(what string, wantIn, wantOut uint64) {
		t.Helper()
		if in.stats.VM.Packets != wantIn || out.stats.VM.Packets != wantOut {
			t.Errorf("%s: the watched helper's stats say %d packets (want %d), the other's %d (want %d)",
				what, in.stats.VM.Packets, wantIn, out.stats.VM.Packets, wantOut)
		}
	}
	write(in, 1)
	write(out, 1)
	c.rotateLogsLocked() // (the watch is made now: every file is looked at)
	check("the first check", 1, 1)

	write(in, 2)
	write(out, 2)
	c.rotateLogsLocked()
	check("a check after writes to both", 2, 1)

	write(in, 3)
	c.watch.Drain() // (as a scrape does first)
	if got := c.observeMovedLocked("a/0", in).Last().VM.Packets; got != 3 {
		t.Errorf("a scrape after a write: %d packets, want 3", got)
	}
	if got := c.observeMovedLocked("b/0", out).Last().VM.Packets; got != 1 {
		t.Errorf("a scrape read the unwatched helper's files again: %d packets", got)
	}

	c.watch.Unknown() // as a queue overflow (IN_Q_OVERFLOW) makes it
	c.rotateLogsLocked()
	check("a check after an overflow", 3, 2)

	// The directory goes and comes back: watched again, and meanwhile
	// every file looked at.
	if err := os.RemoveAll(sd.HelpersDir()); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(sd.HelpersDir(), 0o750); err != nil {
		t.Fatal(err)
	}
	write(in, 4)
	write(out, 3)
	c.rotateLogsLocked()
	check("a check after the directory went", 4, 3)
	c.rotateLogsLocked() // (the watch is made again)
	write(in, 5)
	write(out, 4)
	c.rotateLogsLocked()
	check("a check once watched again", 5, 3)

	// A status holds every line written before it: the watched helper's
	// since the last check (the watch names it), and the other's, whose
	// writes no watch names, each time.
	c.meters = nil
	c.rotateLogsLocked()
	write(in, 6)
	write(out, 5)
	c.watch.Drain() // (as a status does first)
	if got := c.observeForStatusLocked("a/0", in).Last().VM.Packets; got != 6 {
		t.Errorf("a status after a write: %d packets, want 6", got)
	}
	if got := c.observeForStatusLocked("b/0", out).Last().VM.Packets; got != 5 {
		t.Errorf("a status after a write the watch does not see: %d packets, want 5", got)
	}
	c.rotateLogsLocked()
	write(out, 6)
	c.watch.Drain()
	if got := c.observeForStatusLocked("a/0", in).Last().VM.Packets; got != 6 {
		t.Errorf("a status with nothing written: %d packets, want 6", got)
	}
	if got := c.observeForStatusLocked("b/0", out).Last().VM.Packets; got != 6 {
		t.Errorf("a status after another write the watch does not see: %d packets, want 6", got)
	}

	// A stats file rewritten to the same size within a tick of the
	// clock, when the watch could not tell: the check reads it all the
	// same (a stat sees nothing), since a status trusts the watch after.
	base := time.Now().Truncate(time.Second).Add(123456789) // (a time whose text keeps its length)
	rewrite := func(packets uint64, at time.Time) {
		t.Helper()
		s := helperproto.Stats{Time: at, VM: helperproto.Counters{Packets: packets}}
		if err := os.WriteFile(in.statsPath, []byte(helperproto.FormatStatsLine(s)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(in.statsPath, base, base); err != nil {
			t.Fatal(err)
		}
	}
	rewrite(7, base.Add(time.Hour))
	c.rotateLogsLocked()
	c.rotateLogsLocked()
	rewrite(8, base.Add(time.Hour+time.Second))
	c.watch.Drain()
	c.watch.Unknown() // as a queue overflow makes it
	c.rotateLogsLocked()
	c.watch.Drain()
	if got := c.observeForStatusLocked("a/0", in).Last().VM.Packets; got != 8 {
		t.Errorf("a status after a same-size write the watch could not tell: %d packets, want 8", got)
	}
}
