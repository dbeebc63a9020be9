package helperproto

import (
	"os"
	"testing"
	"time"
)

// TestCutLogTime: a line that starts with its time (--log-timestamps) is
// cut there, and its stats still parse; lines without one, or with
// something else first, are left whole.
func TestCutLogTime(t *testing.T) {
	at := time.Date(2026, 12, 5, 11, 54, 0, 123e6, time.UTC)
	stats := `INFO  [stats] {"time":"2026-12-05T11:54:00Z","host":{"packets":1,"bytes":2,"drops":0,"fast":0,"slow":0},"vm":{"packets":3,"bytes":4,"drops":0,"fast":0,"slow":0}}`
	stamped := at.Format(LogTime) + " " + stats
	if got, rest, ok := CutLogTime(stamped); !ok || !got.Equal(at) || rest != stats {
		t.Errorf("CutLogTime(%q) = %v, %q, %v", stamped, got, rest, ok)
	}
	if s, ok := ParseStatsLine(stamped); !ok || s.VM.Packets != 3 {
		t.Errorf("a stamped stats line: %+v, %v", s, ok)
	}
	for _, line := range []string{stats, "INFO  [main] started", "2026 is a year", "", "12:00 [main] x"} {
		if _, rest, ok := CutLogTime(line); ok || rest != line {
			t.Errorf("CutLogTime(%q) cut it: %q", line, rest)
		}
	}
}

// TestReadStatsFile: the first line of a stats file is its latest stats,
// whatever follows it (the end of a longer older line, as a read between
// the helper's write and its cut sees); no file, or no stats line, is no
// stats.
func TestReadStatsFile(t *testing.T) {
	dir := t.TempDir()
	at := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	line := FormatStatsLine(Stats{Time: at, VM: Counters{Packets: 7}})
	path := dir + "/a.stats"
	os.WriteFile(path, []byte(line+"\n"+"ts\":1}}\n"), 0o644)
	if s, ok := ReadStatsFile(path); !ok || s.VM.Packets != 7 || !s.Time.Equal(at) {
		t.Errorf("ReadStatsFile: %+v, %v", s, ok)
	}
	os.WriteFile(path, []byte("INFO  [main] not stats\n"), 0o644)
	if _, ok := ReadStatsFile(path); ok {
		t.Error("a file without a stats line read as stats")
	}
	if _, ok := ReadStatsFile(dir + "/none"); ok {
		t.Error("no file read as stats")
	}
}
