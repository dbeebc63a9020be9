//go:build linux

package relay

import (
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmnetctl/vmnetctl/helperproto"
)

// Logger writes vmnet-helper's stderr format: `LEVEL [component] message`,
// the level padded to five characters; with stamp (vmnetctl's
// --log-timestamps, which vmnet-helper does not have) each line starts
// with its time, helperproto.LogTime's layout, and a space. Each line is
// one Write, so lines of concurrent goroutines never interleave.
type Logger struct {
	mu      sync.Mutex
	w       io.Writer
	verbose bool
	stamp   bool
}

func (l *Logger) Logf(level, component, format string, args ...any) {
	if level == "DEBUG" && !l.verbose {
		return
	}
	line := fmt.Sprintf("%-5s [%s] %s\n", level, component, fmt.Sprintf(format, args...))
	if l.stamp {
		line = time.Now().UTC().Format(helperproto.LogTime) + " " + line
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	io.WriteString(l.w, line)
}

func (l *Logger) Infof(component, format string, args ...any) {
	l.Logf("INFO", component, format, args...)
}
func (l *Logger) Warnf(component, format string, args ...any) {
	l.Logf("WARN", component, format, args...)
}
func (l *Logger) Debugf(component, format string, args ...any) {
	l.Logf("DEBUG", component, format, args...)
}

// Limited is a kind of log line that a guest or a local process can cause
// at will (a datagram from an unbound client): it is logged at most once
// per every, the first of each period, with the count of those left out
// since the last one written, so that the log stays small however fast
// they come.
type Limited struct {
	every   time.Duration
	last    time.Time // when one was last written
	dropped int       // left out since
}

// warnLimited logs like warnf, through lim.
func (l *Logger) WarnLimited(lim *Limited, component, format string, args ...any) {
	now := time.Now()
	if !lim.last.IsZero() && now.Sub(lim.last) < lim.every {
		lim.dropped++
		return
	}
	msg := fmt.Sprintf(format, args...)
	if lim.dropped > 0 {
		msg += fmt.Sprintf(" (%d more like this in the last %s, not logged)", lim.dropped, now.Sub(lim.last).Round(time.Second))
	}
	lim.last, lim.dropped = now, 0
	l.Logf("WARN", component, "%s", msg)
}

// StatsOut is where a helper's stats lines go. Without a file, each to
// the log (vmnet-helper's contract). With one (--stats-file: the
// controller's helpers), each replaces the file's content, which the
// controller reads for its metrics, and the log gets one at most every
// StatsLogEvery, and the last: a busy helper's log is not a list of
// counters every few seconds.
type StatsOut struct {
	Log    *Logger
	File   *os.File
	mu     sync.Mutex
	logged time.Time
}

// StatsLogEvery is how often, at most, a helper with a stats file logs a
// stats line.
const StatsLogEvery = time.Minute

// Emit writes the stats line of st; last is the helper's final one.
func (o *StatsOut) Emit(st helperproto.Stats, last bool) {
	line := helperproto.FormatStatsLine(st)
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.File != nil {
		// The line at the file's start, then the file cut to it: a
		// reader takes the first line (one that came between the two
		// sees the old line's end after it).
		o.File.WriteAt([]byte(line+"\n"), 0)
		o.File.Truncate(int64(len(line) + 1))
	}
	if o.File == nil || last || o.logged.IsZero() || st.Time.Sub(o.logged) >= StatsLogEvery {
		o.logged = st.Time
		o.Log.Logf("INFO", "stats", "%s", line[len(helperproto.StatsPrefix):])
	}
}

// counters are one direction's cumulative counts, updated once per batch.
type counters struct {
	packets, bytes, drops, fast, slow atomic.Uint64
}

func (c *counters) snapshot() helperproto.Counters {
	return helperproto.Counters{
		Packets: c.packets.Load(), Bytes: c.bytes.Load(), Drops: c.drops.Load(),
		Fast: c.fast.Load(), Slow: c.slow.Load(),
	}
}

// syscalls counts one syscall that moved n frames.
func (c *counters) syscall(n int) {
	if n > 1 {
		c.fast.Add(1)
	} else {
		c.slow.Add(1)
	}
}
