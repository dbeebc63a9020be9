package controller

import (
	"bufio"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/helperexec"
	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/launch"
	"github.com/vmnetctl/vmnetctl/spec"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// helperProc is one supervised helper.
type helperProc struct {
	rec     statedir.HelperRecord
	att     *spec.Attachment
	state   string
	lastErr string
	exited  <-chan struct{} // closed when the process is gone
	backoff Backoff
	retryAt time.Time
	// retryAsked: an `up` asked for a try now (retryNow) while this
	// helper's start was under way, a try begun before the cause may have
	// been put right; if it fails, the next pass tries again at once.
	retryAsked bool
	proc       *helperexec.Helper // nil for an adopted helper
	// leaving: its attachment is no longer desired (not replaced), so its
	// socket goes with it (stopHelpers).
	leaving bool
	// stopped: the controller stops it (takeStopping), so its exit asks
	// for no pass: the pass that stops it is the one that follows.
	stopped atomic.Bool
	logPath string
	// statsPath is where the helper keeps its latest stats line
	// (--stats-file; none there for vmnet-helper).
	statsPath string
	// startLatency is how long the helper took from exec to ready.
	startLatency time.Duration
	stats        helperproto.Stats
	statsOff     int64
	// looked is what the periodic check of the logs last saw of the
	// helper's log and stats file (filesMoved).
	looked [2]fileLook
	// lastFromVM is when the helper's stats last counted a frame from the
	// VM; client is the socket path of the VMM it serves (--socket), both
	// from its log.
	lastFromVM time.Time
	client     string
	// tapMeter turns the counters of the TAP a VMM drives (`attach:
	// tap`), which the controller reads (sampleTaps), into the helper's
	// stats.
	tapMeter helperproto.TapMeter
	// session is, for a helper whose VMM connects to it (attach: stream
	// or vhost-user), "connected" while one is and "VM gone" once it
	// went, from its log ("" until one came).
	session string
}

// closedChan is an exited channel for a helper that is not running.
func closedChan() <-chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}

// launchHelper starts the helper of a supervised attachment and waits until
// it is ready.
func (c *Controller) launchHelper(ctx context.Context, a *spec.Attachment, n *api.Network, owner *statedir.Project) (*helperProc, error) {
	logStart := fileSize(c.sd.HelperLogFile(a.Key()))
	began := time.Now()
	proc, rec, err := c.launcher().Start(ctx, launch.HelperStart{Attachment: a, Network: n, Owner: owner})
	if err != nil {
		return nil, err
	}
	h := &helperProc{att: a, proc: proc, exited: proc.Done(), logPath: c.sd.HelperLogFile(a.Key()), statsPath: c.sd.HelperStatsFile(a.Key()), state: ctlapi.StateRunning,
		statsOff: logStart, startLatency: time.Since(began), rec: rec}
	proc.OnExit(func() { c.exited(h) })
	return h, nil
}

// exited asks for a pass once h's process has exited, unless the
// controller stopped it.
func (c *Controller) exited(h *helperProc) {
	c.mu.Lock()
	c.markPortGone(h.rec)
	c.mu.Unlock()
	if !h.stopped.Load() {
		c.kick()
	}
}

func (c *Controller) launcher() launch.Launcher {
	return launch.Launcher{StateDir: c.sd, Backend: c.be, Executable: c.opts.Executable, VMNetHelperPath: c.paths.VMNetHelper,
		StatsInterval: c.opts.StatsInterval, StallTimeout: c.opts.StallTimeout, StopGrace: c.opts.StopGrace, Spares: c.spares,
		TapCountsRead: true} // (status and scrapes: observeTapLocked)
}

func fileSize(path string) int64 {
	if fi, err := os.Stat(path); err == nil {
		return fi.Size()
	}
	return 0
}

// logTail returns the helper's log lines written since offset, for errors.
func logTail(path string, offset int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return ""
	}
	var lines []string
	sc := bufio.NewScanner(io.LimitReader(f, 64<<10))
	for sc.Scan() {
		if _, isStats := helperproto.ParseStatsLine(sc.Text()); !isStats {
			lines = append(lines, sc.Text())
		}
	}
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	if len(lines) == 0 {
		return ""
	}
	return "\nhelper's stderr:\n  " + strings.Join(lines, "\n  ")
}

// stopProc stops a helper: SIGTERM, then SIGKILL after the grace period.
// It returns once the helper is gone. Signals go to the helper's pid only:
// its root child must live on to delete its TAP.
func (c *Controller) stopProc(h *helperProc) {
	if h.proc != nil {
		if err := h.proc.Stop(); err != nil {
			c.log.Warn("stopping helper", "attachment", h.rec.Key, "err", err)
		}
		return
	}
	// Adopted: not our child, known by its identity.
	if h.rec.Proc.Kill(c.opts.StopGrace) {
		c.log.Warn("helper did not stop on SIGTERM; killed it", "attachment", h.rec.Key, "pid", h.rec.Proc.PID)
	}
}

// adopt takes over a helper that a previous controller started and that
// still runs: the same pid, start time and command line.
func (c *Controller) adopt(rec statedir.HelperRecord) *helperProc {
	exited := make(chan struct{})
	h := &helperProc{rec: rec, exited: exited, state: ctlapi.StateRunning,
		logPath: c.sd.HelperLogFile(rec.Key), statsPath: c.sd.HelperStatsFile(rec.Key),
		tapMeter: helperproto.TapMeterFromFirstRead()} // (whoever held its TAP before is not known)
	if fi, err := os.Stat(h.logPath); err == nil {
		// The client it serves, from the whole log (at most
		// statedir.MaxHelperLog); then the latest stats line.
		readStatsLines(h, func(helperproto.Stats) {})
		h.statsOff = max(0, fi.Size()-4096)
	}
	rec.Proc.OnExit(func() {
		close(exited)
		c.exited(h)
	})
	return h
}

// rotateLogsLocked keeps the helpers' logs and the controller's own under
// their limits (statedir.RotateLog); a helper's stats lines are read before
// its log is emptied.
//
// A helper whose files did not change since the last check is not read: a
// check is then two stats a helper, not a dozen syscalls and the
// allocations of two reads (35% of an idle controller's CPU with 3,000
// helpers). Status and metrics read the files the watch named since
// (observeForStatusLocked, observeMovedLocked).
func (c *Controller) rotateLogsLocked() {
	c.logsChecked = time.Now()
	c.watch.Drain()
	c.shapingWatch.Drain() // (so that its queue holds 10 s of events, not a resync's)
	for key, h := range c.helpers {
		if h.logPath == "" || c.watchSawNoWriteLocked(h) {
			continue
		}
		// A helper whose files are in the watched directory is read,
		// whatever a stat says (a write within a tick of the file
		// system's clock that keeps the size looks the same): the watch
		// named a file of its, or could not tell (then every such
		// helper), and a status takes the meter as current until the
		// watch names h again (observeForStatusLocked). Elsewhere, and
		// where nothing watches, a stat decides.
		if moved := h.filesMoved(); !moved && !(c.watch.Watching() && c.inWatchedDir(h)) {
			continue
		}
		c.observeLocked(key, h)
		if h.looked[0].size <= statedir.MaxHelperLog {
			continue
		}
		rotated, err := statedir.RotateLog(h.logPath, statedir.MaxHelperLog)
		if err != nil {
			c.log.Warn("rotating a helper's log", "attachment", key, "err", err)
		} else if rotated {
			h.statsOff = 0
		}
	}
	c.watch.Take()
	if _, err := statedir.RotateLog(c.sd.ControllerLog(), statedir.MaxControllerLog); err != nil {
		c.log.Warn("rotating the controller's log", "err", err)
	}
}

// fileLook is what a stat of a file said: its size and the time it was
// last written.
type fileLook struct {
	size, mtime int64 // mtime in ns
}

// look stats path (not following a link); a file that is not there is
// the zero look.
func look(path string) fileLook {
	if path == "" {
		return fileLook{}
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return fileLook{}
	}
	return fileLook{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
}

// inWatchedDir says that h's log and stats file are in the directory the
// controller's file watch watches (a helper's files elsewhere would never
// be named: the watch's silence says nothing of them).
func (c *Controller) inWatchedDir(h *helperProc) bool {
	dir := c.sd.HelpersDir()
	return filepath.Dir(h.logPath) == dir && filepath.Dir(h.statsPath) == dir
}

// watchSawNoWriteLocked says that the controller's file watch saw no write
// to h's log or stats file since the last log check looked at them (false
// where it cannot tell, or no check has looked yet).
func (c *Controller) watchSawNoWriteLocked(h *helperProc) bool {
	return h.looked != ([2]fileLook{}) && !c.watch.Moved(h.logPath) && !c.watch.Moved(h.statsPath)
}

// lookNow is what h's log and stats file look like now, as h.looked
// keeps it.
func (h *helperProc) lookNow() [2]fileLook {
	return [2]fileLook{look(h.logPath), look(h.statsPath)}
}

// filesMoved reports whether h's log or stats file was written (or
// appeared, or went) since the last call, and records what it saw. A
// write within the same tick of the file system's clock that keeps the
// size can go unseen until the next one: the check only keeps the meters
// and the log's size in step, and status reads the files whole.
func (h *helperProc) filesMoved() bool {
	now := h.lookNow()
	moved := now != h.looked
	h.looked = now
	return moved
}

// rotateLogsDueLocked is rotateLogsLocked, unless it ran less than
// logCheckInterval ago: each pass would otherwise read and stat every
// helper's log, a thousand files for one VM's attach.
func (c *Controller) rotateLogsDueLocked() {
	if time.Since(c.logsChecked) >= logCheckInterval {
		c.rotateLogsLocked()
	}
}

// gonePorts are the ports of a network that may have gone since its last
// claims: their interface indexes, and whether some whose index is not
// known (a helper of an older vmnetctl, whose record has none) went too.
type gonePorts struct {
	indexes []uint32
	unknown bool
}

// markPortGone notes that the port of helper rec may have gone
// (portsGone). Call with c.mu held.
func (c *Controller) markPortGone(rec statedir.HelperRecord) {
	if c.portsGone == nil {
		c.portsGone = map[string]*gonePorts{}
	}
	g := c.portsGone[rec.Network]
	if g == nil {
		g = &gonePorts{}
		c.portsGone[rec.Network] = g
	}
	if rec.TapIndex > 0 {
		g.indexes = append(g.indexes, uint32(rec.TapIndex))
	} else {
		g.unknown = true
	}
}
