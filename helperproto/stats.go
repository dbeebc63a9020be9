package helperproto

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"time"
)

// Counters are one direction's cumulative counts in a stats line.
type Counters struct {
	// Packets and Bytes were forwarded; Drops were lost (peer too slow,
	// oversized, or malformed).
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
	Drops   uint64 `json:"drops"`
	// Fast counts syscalls that moved a batch of frames, Slow those that
	// moved one.
	Fast uint64 `json:"fast"`
	Slow uint64 `json:"slow"`
}

// Stats is one `INFO  [stats] {...}` line. Host counts the frames forwarded
// to the VM, VM the frames it sent.
type Stats struct {
	Time time.Time `json:"-"`
	Host Counters  `json:"host"`
	VM   Counters  `json:"vm"`
}

// StatsPrefix starts every stats line on a helper's stderr.
const StatsPrefix = "INFO  [stats] "

// ReadStatsFile reads the latest stats of a helper's stats file
// (`vmnetctl helper --stats-file`): its first line, since the helper puts
// each line at the file's start before it cuts the file to it, and a read
// in between sees the end of a longer older line after it. ok is false
// without the file or a stats line in it.
func ReadStatsFile(path string) (Stats, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Stats{}, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return ParseStatsLine(line)
}

// LogTime is the layout of the time that starts each line of a helper's
// log with --log-timestamps (RFC 3339, UTC, milliseconds).
const LogTime = "2006-01-02T15:04:05.000Z07:00"

// CutLogTime splits the time off a log line that starts with one
// (--log-timestamps); ok is false, and rest the line, when it does not.
func CutLogTime(line string) (t time.Time, rest string, ok bool) {
	stamp, rest, found := strings.Cut(line, " ")
	if !found || len(stamp) < len("2006-01-02T15:04:05Z") || stamp[0] < '0' || stamp[0] > '9' {
		return time.Time{}, line, false
	}
	t, err := time.Parse(time.RFC3339Nano, stamp)
	if err != nil {
		return time.Time{}, line, false
	}
	return t, rest, true
}

// ParseStatsLine parses a stats line of a helper's stderr, with or without
// the time that starts it with --log-timestamps. ok is false for any other
// line, or a stats line that is not valid.
func ParseStatsLine(line string) (Stats, bool) {
	line = strings.TrimRight(line, "\r\n")
	_, line, _ = CutLogTime(line)
	rest, ok := strings.CutPrefix(line, StatsPrefix)
	if !ok {
		return Stats{}, false
	}
	var wire struct {
		Time json.RawMessage `json:"time"`
		Host *Counters       `json:"host"`
		VM   *Counters       `json:"vm"`
	}
	dec := json.NewDecoder(strings.NewReader(rest))
	if err := dec.Decode(&wire); err != nil || wire.Host == nil || wire.VM == nil {
		return Stats{}, false
	}
	if dec.More() {
		return Stats{}, false
	}
	s := Stats{Host: *wire.Host, VM: *wire.VM}
	s.Time, _ = parseStatsTime(wire.Time)
	return s, true
}

// parseStatsTime accepts an RFC 3339 string or seconds since the epoch.
func parseStatsTime(raw json.RawMessage) (time.Time, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return time.Time{}, false
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		t, err := time.Parse(time.RFC3339Nano, s)
		return t, err == nil
	}
	var f float64
	if json.Unmarshal(raw, &f) == nil && f >= 0 && f < 1e11 {
		sec := int64(f)
		return time.Unix(sec, int64((f-float64(sec))*1e9)).UTC(), true
	}
	return time.Time{}, false
}

// FormatStatsLine is the stats line a helper logs for s, without a newline.
func FormatStatsLine(s Stats) string {
	b, _ := json.Marshal(struct {
		Time string   `json:"time"`
		Host Counters `json:"host"`
		VM   Counters `json:"vm"`
	}{s.Time.UTC().Format(time.RFC3339Nano), s.Host, s.VM})
	return StatsPrefix + string(b)
}
