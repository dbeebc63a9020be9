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

// TestLogCheckReadsWhatMoved: the periodic check of the helpers' logs
// reads a helper's files only when they were written since the last
// check, and reads them when they were.
func TestLogCheckReadsWhatMoved(t *testing.T) {
	dir := t.TempDir()
	h := &helperProc{logPath: filepath.Join(dir, "a.log"), statsPath: filepath.Join(dir, "a.stats")}
	c := &Controller{sd: statedir.Dir{Path: dir}, log: slog.New(slog.DiscardHandler), helpers: map[string]*helperProc{"a/0": h}}
	writeStats := func(packets uint64) {
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
