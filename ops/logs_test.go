package ops

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// logs --json: one JSON object per line, {time, vm, index, source, line},
// the time the line's own (the controller's slog time=, a stats line's).
func TestLogsJSON(t *testing.T) {
	sd := statedir.Dir{Path: t.TempDir()}
	os.MkdirAll(filepath.Dir(sd.ControllerLog()), 0o755)
	ctl := "time=2026-11-24T03:00:00.5Z level=INFO msg=\"network up\" network=shared\n"
	if err := os.WriteFile(sd.ControllerLog(), []byte(ctl), 0o644); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := Logs(context.Background(), sd, "", false, true, &out); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(out.String()), &got); err != nil {
		t.Fatalf("logs --json: %v\n%s", err, out.String())
	}
	want := map[string]any{"time": "2026-11-24T03:00:00.5Z", "source": "controller", "line": strings.TrimSuffix(ctl, "\n")}
	if len(got) != len(want) || got["time"] != want["time"] || got["source"] != want["source"] || got["line"] != want["line"] {
		t.Errorf("logs --json of the controller: %v, want %v", got, want)
	}

	// A helper's lines: its VM and index; a stats line's time, the time
	// that starts a line (--log-timestamps), none for the others.
	helperLog := filepath.Join(t.TempDir(), "web-1.log")
	stats := helperproto.FormatStatsLine(helperproto.Stats{Time: time.Date(2026, 11, 24, 3, 1, 0, 0, time.UTC)})
	stamped := "2026-11-24T03:02:00.250Z INFO  [main] serving client \"/run/x.sock\""
	os.WriteFile(helperLog, []byte("INFO  [main] ready\n"+stats+"\n"+stamped+"\n"), 0o644)
	out.Reset()
	one := 1
	if err := tailSources(context.Background(), []*logSource{{prefix: "web/1 | ", path: helperLog,
		json: &LogLine{Source: LogSourceHelper, VM: "web", Index: &one}}}, &out, false); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("logs --json of a helper: %q", lines)
	}
	for i, want := range []string{
		`{"vm":"web","index":1,"source":"helper","line":"INFO  [main] ready"}`,
		`{"time":"2026-11-24T03:01:00Z","vm":"web","index":1,"source":"helper","line":` + string(must(json.Marshal(stats))) + `}`,
		`{"time":"2026-11-24T03:02:00.25Z","vm":"web","index":1,"source":"helper","line":` + string(must(json.Marshal(stamped))) + `}`,
	} {
		if lines[i] != want {
			t.Errorf("line %d: %s\nwant %s", i, lines[i], want)
		}
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

// TestLogsSince: logs --since prints the lines logged since then, a line
// without a time of its own going with the line before it; with --tail,
// the last N of those.
func TestLogsSince(t *testing.T) {
	sd := statedir.Dir{Path: t.TempDir()}
	os.MkdirAll(filepath.Dir(sd.ControllerLog()), 0o755)
	log := "time=2026-11-24T03:00:00Z level=INFO msg=old\n" +
		"  a continuation of old\n" +
		"time=2026-11-24T03:05:00Z level=INFO msg=new\n" +
		"  a continuation of new\n" +
		"time=2026-11-24T03:06:00Z level=INFO msg=newer\n"
	if err := os.WriteFile(sd.ControllerLog(), []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	since := time.Date(2026, 11, 24, 3, 1, 0, 0, time.UTC)
	for _, tc := range []struct {
		o    TailOptions
		want string
	}{
		{TailOptions{Since: since}, "time=2026-11-24T03:05:00Z level=INFO msg=new\n  a continuation of new\ntime=2026-11-24T03:06:00Z level=INFO msg=newer\n"},
		{TailOptions{Since: since, Tail: 1}, "time=2026-11-24T03:06:00Z level=INFO msg=newer\n"},
		{TailOptions{Since: since.Add(time.Hour)}, ""},
	} {
		var out strings.Builder
		if err := LogsTail(context.Background(), sd, "", tc.o, &out); err != nil {
			t.Fatal(err)
		}
		if out.String() != tc.want {
			t.Errorf("logs %+v:\n%s\nwant\n%s", tc.o, out.String(), tc.want)
		}
	}
}
