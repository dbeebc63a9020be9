package controller

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// logLab is a controller of one helper "a/0" whose log has a line and
// whose stats file says 1 packet from the VM; writeStats writes another.
func logLab(t *testing.T) (c *Controller, h *helperProc, writeStats func(packets uint64)) {
	dir := t.TempDir()
	h = &helperProc{logPath: filepath.Join(dir, "a.log"), statsPath: filepath.Join(dir, "a.stats")}
	c = &Controller{sd: statedir.Dir{Path: dir}, log: slog.New(slog.DiscardHandler), helpers: map[string]*helperProc{"a/0": h}}
	writeStats = func(packets uint64) {
		t.Helper()
		s := helperproto.Stats{Time: time.Now(), VM: helperproto.Counters{Packets: packets}}
		if err := os.WriteFile(h.statsPath, []byte(helperproto.FormatStatsLine(s)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(h.logPath, []byte("INFO  [main] forwarding started\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	writeStats(1)
	return c, h, writeStats
}

// TestLogCheckReadsWhatMoved: the periodic check of the helpers' logs
// reads a helper's files only when they were written since the last
// check, and reads them when they were.
func TestLogCheckReadsWhatMoved(t *testing.T) {
	c, h, writeStats := logLab(t)
	c.rotateLogsLocked()
	if h.stats.VM.Packets != 1 {
		t.Fatalf("first check: stats %+v, want the file's", h.stats)
	}
	h.stats = helperproto.Stats{}
	c.rotateLogsLocked()
	if h.stats.VM.Packets != 0 {
		t.Errorf("a check with nothing written read the stats file again")
	}
	writeStats(22)
	c.rotateLogsLocked()
	if h.stats.VM.Packets != 22 {
		t.Errorf("a check after a write: stats %+v, want 22 packets", h.stats)
	}
}

// TestScrapeReadsWhatMoved: a scrape does not read again the files of a
// helper that the last log check read and that were not written since,
// and reads those that were, whether or not a check came between; the
// log check after a scrape still sees what moved (its look is its own).
func TestScrapeReadsWhatMoved(t *testing.T) {
	c, h, writeStats := logLab(t)
	if got := c.observeMovedLocked("a/0", h).Last().VM.Packets; got != 1 {
		t.Fatalf("a scrape before any check: %d packets, want the file's 1", got)
	}
	c.rotateLogsLocked()
	h.stats = helperproto.Stats{}
	c.observeMovedLocked("a/0", h)
	if h.stats.VM.Packets != 0 {
		t.Errorf("a scrape with nothing written since the check read the stats file again")
	}
	writeStats(22)
	if got := c.observeMovedLocked("a/0", h).Last().VM.Packets; got != 22 {
		t.Errorf("a scrape after a write: %d packets, want 22", got)
	}
	writeStats(23)
	c.rotateLogsLocked()
	if h.stats.VM.Packets != 23 {
		t.Errorf("the check after a scrape: stats %+v, want 23 packets", h.stats)
	}
}
