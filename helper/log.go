//go:build linux

package helper

import (
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/vmnetctl/vmnetctl/helperproto"
)

// logger writes vmnet-helper's stderr format: `LEVEL [component] message`,
// the level padded to five characters. Each line is one Write, so lines of
// concurrent goroutines never interleave.
type logger struct {
	mu      sync.Mutex
	w       io.Writer
	verbose bool
}

func (l *logger) logf(level, component, format string, args ...any) {
	if level == "DEBUG" && !l.verbose {
		return
	}
	line := fmt.Sprintf("%-5s [%s] %s\n", level, component, fmt.Sprintf(format, args...))
	l.mu.Lock()
	defer l.mu.Unlock()
	io.WriteString(l.w, line)
}

func (l *logger) infof(component, format string, args ...any) {
	l.logf("INFO", component, format, args...)
}
func (l *logger) warnf(component, format string, args ...any) {
	l.logf("WARN", component, format, args...)
}
func (l *logger) debugf(component, format string, args ...any) {
	l.logf("DEBUG", component, format, args...)
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
