package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/backend"
	"github.com/vmnetctl/vmnetctl/backends"
	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/dirwatch"
	"github.com/vmnetctl/vmnetctl/helperexec"
	"github.com/vmnetctl/vmnetctl/launch"
	"github.com/vmnetctl/vmnetctl/spec"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// Options configure a controller.
type Options struct {
	StateDir statedir.Dir
	// Executable is the vmnetctl binary that runs helpers; default this one.
	Executable string
	Log        *slog.Logger
	// Resync is how often the controller reconciles without being asked.
	Resync time.Duration
	// ExitWhenIdle ends the controller once no project is left (the one
	// `up` starts in the background); otherwise it stays, as a service.
	ExitWhenIdle bool
	// LockUntilExit keeps the controller's lock after Run returns, for the
	// kernel to release as the process exits (`vmnetctl serve`): whoever
	// waits for the lock to be free (down, after the last project) then
	// finds the process gone, not still exiting.
	LockUntilExit bool
	// CloseInherited closes, first thing in Run, the descriptors this
	// process inherited without close-on-exec (`vmnetctl serve`, the
	// daemon: whoever started it keeps its own; closeInherited).
	CloseInherited bool
	// StatsInterval is the helpers' --stats-interval.
	StatsInterval time.Duration
	// StallTimeout is how long a starting helper may make no progress
	// before it is failed (helperexec.StartOptions); StopGrace bounds its
	// SIGTERM.
	StallTimeout time.Duration
	StopGrace    time.Duration
	// Upstreams are the DNS proxies' resolvers (default: /etc/resolv.conf's).
	Upstreams []string
	// Group may use the API socket (besides root); empty for root only.
	Group string
	// MetricsAddr is where /metrics and /healthz are served over HTTP
	// (default DefaultMetricsAddr; "off" serves none).
	MetricsAddr string
	// Backend is the platform's data plane and helper (default: by GOOS).
	Backend backend.Backend
	// Version is the controller's version for vmnetctl_build_info.
	Version string
	// Spares is how many relays the controller keeps started ahead of
	// need for each kind of helper (program, owner) it started in the
	// last SpareIdle (helperexec.Spares): an attach hands its helper to
	// one instead of starting a process. 0 is DefaultSpares; negative
	// keeps none.
	Spares int
}

// DefaultSpares is Options.Spares's default: one spare takes a VM's
// attach while another starts.
const DefaultSpares = 2

// SpareIdle is how long the spares of a kind of helper that is no longer
// started are kept.
const SpareIdle = 5 * time.Minute

func (o *Options) setDefaults() error {
	if o.Executable == "" {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		o.Executable = exe
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Resync <= 0 {
		o.Resync = ctlapi.DefaultResync()
	}
	if o.StatsInterval == 0 {
		o.StatsInterval = launch.DefaultStatsInterval
		if d, err := time.ParseDuration(os.Getenv(ctlapi.EnvStatsInterval)); err == nil && d > 0 {
			o.StatsInterval = d
		}
	}
	if o.Version == "" {
		o.Version = buildVersion()
	}
	if o.StallTimeout == 0 {
		o.StallTimeout = launch.DefaultStallTimeout
	}
	if o.StopGrace == 0 {
		o.StopGrace = launch.DefaultStopGrace
	}
	if o.Backend == nil {
		o.Backend = backends.Default()
	}
	if o.MetricsAddr == "" {
		o.MetricsAddr = ctlapi.DefaultMetricsAddr
	}
	if o.Spares == 0 {
		o.Spares = DefaultSpares
		if n, err := strconv.Atoi(os.Getenv(ctlapi.EnvSpares)); err == nil {
			o.Spares = max(n, -1)
		}
	}
	return nil
}

// Controller keeps what runs equal to what the projects in the state dir ask for.
type Controller struct {
	opts Options
	sd   statedir.Dir
	log  *slog.Logger
	be   backend.Backend
	// spares are the relays started ahead of need, while Run runs.
	spares *helperexec.Spares

	// progress is what the reconcile loop does now, outside mu.
	progress progress

	mu      sync.Mutex
	nets    map[string]backend.Network
	paths   api.Paths // networks.yaml's, as last read
	netErrs map[string]string
	// degraded holds, by network, why its kernel state differs from what
	// it should be, from when the drift is found (before the repair
	// starts) until a repair succeeds; repairs counts the repairs made.
	degraded map[string]string
	// strays: sweep the networks no project wants and nothing recorded
	// (sweepStrays), at the first pass and after a failed removal.
	strays  bool
	repairs map[string]uint64
	// repairRetry holds the networks whose last repair failed: when to
	// try again (with backoff) and why it failed.
	repairRetry map[string]*repairRetry
	// watchedHolders are the holder processes (Project.Holder) whose exit
	// triggers a reconcile.
	watchedHolders map[int]bool
	helpers        map[string]*helperProc
	// portsGone are the networks some port of which may have gone since
	// their last claims (a helper stopped or exited), with those ports:
	// the next claims look for the guards of gone ports there
	// (nettypes.ClaimOptions).
	portsGone map[string]*gonePorts
	// claimed are the running networks whose last claims succeeded: a
	// pass that changes none of a network's attachments leaves its
	// claims as they are (claimPorts).
	claimed map[string]bool
	// settle tells the full passes whether the VM ports are as the last
	// that read them left them (Run's reconcile loop alone uses it).
	settle settled
	// hosts is what the passes told the networks of the attachments
	// (SetHost): a pass tells a network only of what changed, the full
	// passes of everything (setHosts).
	hosts hostState
	// bandwidth is, by attachment key, the limits set on the ports that
	// have one (setBandwidth).
	bandwidth map[string]bandwidthSet
	// captures counts the captures that run (serveCapture).
	captures atomic.Int32
	// partitions is, by network, the pairs setPartitions last set.
	partitions map[string]partitionsSet
	// impairs is, by network, what setImpairments last set; overrides
	// what `vmnetctl impair` recorded (once overridesRead).
	impairs map[string]impairSet
	// shapings is, by attachment, what setShapings last wrote for its
	// helper; unshaped, the helpers whose shaping files a full pass found
	// as they should be, empty (their pids); shapingWatch tells which of
	// those files were written since (the last full pass took it).
	shapings      map[string]shapingSet
	unshaped      map[string]int
	shapingWatch  *dirwatch.Watch
	overrides     []statedir.ImpairOverride
	overridesRead bool
	applied       *spec.Desired
	appliedN      *statedir.NetworksSnapshot
	appliedP      []*statedir.Project
	lastErr       error
	lastOK        time.Time
	started       time.Time

	// Reconcile bookkeeping for metrics.
	reconciles        map[string]uint64 // by result: "success", "error"
	lastReconcileTime time.Duration
	// meters keep each helper's latest stats lines for rates (metrics.go).
	meters map[string]*trafficMeter
	// procs keeps the helpers' process accounting between scrapes.
	procs procCache

	// appliedView is applied, for readers that must not take mu.
	appliedView atomic.Pointer[spec.Desired]
	// eventsMu serializes writes to the events log.
	eventsMu sync.Mutex
	// leaseKick wakes watchLeaseExpiry when a lease is granted (events.go).
	leaseKick chan struct{}

	kickc chan struct{}
	// netSockets serve the networks' stream sockets (netsocket.go), by
	// network; under mu.
	netSockets map[string]*netSocket
	// runtime writes runtime.json, the helpers' records and the projects
	// as applied (saveRuntime).
	runtime statedir.RuntimeWriter
	// projects reads the projects' records, each decoded again only when
	// it changed (the passes, check, the file watch's reload).
	projects statedir.ProjectReader
	// runtimeRecs is saveRuntime's, kept from one pass to the next: a
	// pass allocates no list of the fleet's size.
	runtimeRecs []statedir.HelperRecord
	// logsChecked is when rotateLogsLocked last ran; watch tells it (and
	// a scrape) which of the helpers' files were written since.
	logsChecked time.Time
	watch       *dirwatch.Watch
	// resolver is the desired state as the last pass resolved it, and
	// the projects' files as it parsed them; under parseMu, which `up`'s
	// checks (check.go) take without mu.
	resolver spec.Resolver
	parseMu  sync.Mutex
	// netsOf is the networks parsed last, and the record they were
	// parsed from (loadNetworks); under parseMu.
	netsOf struct {
		snap statedir.NetworksSnapshot
		nets *api.Networks
	}
	gen genWaiter
	// changing lets one change of the projects' API (apply.go) at a time
	// through; changes counts those under way, exiting says the loop
	// exits (no project was left), idleDeferred that it stayed for a
	// change, and looks again when the last ends. Under mu.
	changing     chan struct{}
	changes      int
	exiting      bool
	idleDeferred bool
}

// New makes a controller; Run starts it.
func New(opts Options) (*Controller, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	return &Controller{opts: opts, sd: opts.StateDir, log: opts.Log, be: opts.Backend,
		nets: map[string]backend.Network{}, netErrs: map[string]string{}, helpers: map[string]*helperProc{}, portsGone: map[string]*gonePorts{},
		degraded: map[string]string{}, strays: true, repairs: map[string]uint64{}, repairRetry: map[string]*repairRetry{}, watchedHolders: map[int]bool{},
		reconciles: map[string]uint64{}, watch: dirwatch.New(opts.StateDir.HelpersDir()), shapingWatch: dirwatch.New(opts.StateDir.HelpersDir()),
		kickc: make(chan struct{}, 1), leaseKick: make(chan struct{}, 1), changing: make(chan struct{}, 1), started: time.Now()}, nil
}

func (c *Controller) kick() {
	select {
	case c.kickc <- struct{}{}:
	default:
	}
}

// Run takes the state dir's controller lock, adopts the helpers a previous
// controller left running, serves the API and reconciles until ctx ends or
// no project is left. Helpers keep running when it returns because ctx ended:
// VMs keep their network while the controller restarts.
func (c *Controller) Run(ctx context.Context) error {
	if c.opts.CloseInherited {
		closeInherited()
	}
	if err := c.sd.Init(); err != nil {
		return err
	}
	lock, err := c.sd.TryLockController()
	if err != nil {
		if errors.Is(err, statedir.ErrLocked) {
			return fmt.Errorf("a controller already runs for %s", c.sd.Path)
		}
		return err
	}
	if c.opts.LockUntilExit {
		// Referenced until Run returns: a collected lock's file would
		// be closed, and the lock released, while the controller runs.
		defer runtime.KeepAlive(lock)
	} else {
		defer lock.Unlock()
	}
	if err := raiseOpenFiles(); err != nil {
		c.log.Warn("helpers may fail to start with too many open files", "err", err)
	}
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	c.restore()
	if c.opts.Spares > 0 {
		c.spares = helperexec.NewSpares(c.opts.Spares, SpareIdle, c.sd.Path)
		// (Run's return, or the process's exit, ends them: their
		// sockets close.)
		defer c.spares.Close()
	}

	stopServing, err := c.serve()
	if err != nil {
		return err
	}
	defer func() { // after the servers stop: a scrape or a check would watch again
		c.mu.Lock()
		defer c.mu.Unlock()
		c.watch.Close()
		c.shapingWatch.Close()
		c.projects.Close()
	}()
	defer stopServing()
	c.log.Info("controller started", "stateDir", c.sd.Path, "pid", os.Getpid(), "metrics", c.opts.MetricsAddr)

	resync := time.NewTimer(c.opts.Resync)
	defer resync.Stop()
	logs := time.NewTicker(logCheckInterval)
	defer logs.Stop()
	// Changes made behind the controller's back (a bridge, a bridge
	// address or an nftables table deleted, a DHCP or DNS listener
	// stopped) are repaired at once; the rest (a rule deleted) at the next
	// resync.
	var changes <-chan struct{}
	if w, ok := c.be.(backend.Watcher); ok {
		var err error
		if changes, c.settle.notices, err = w.Changes(ctx); err != nil {
			c.log.Warn("not watching the networks for changes; repairs wait for the resync", "err", err)
		}
	}
	go c.watchLeaseExpiry(ctx)
	go c.sampleTaps(ctx)
	// SIGHUP (systemctl reload): the files read again (reload.go).
	hup, stopHangups := hangups()
	defer stopHangups()
	reloadWanted, reloadAgain := false, (<-chan time.Time)(nil)
	full := true // the first pass checks everything
	for first := true; ; first = false {
		if reloadWanted {
			reloadWanted, reloadAgain = false, nil
			if c.reloadNow() {
				reloadWanted, reloadAgain = true, time.After(reloadRetry)
			}
		}
		began := time.Now()
		if full {
			c.spares.Trim()
		}
		done, err := c.reconcile(ctx, full)
		if err != nil {
			c.log.Error("reconcile failed", "err", err)
		}
		// The spares of the helpers this pass started, started now that
		// it is done, not beside its starts.
		c.spares.Refill()
		if full {
			resync.Reset(resyncAfter(c.opts.Resync, time.Since(began)))
		}
		if first {
			// Under systemd (Type=notify) `systemctl start` returns
			// now: the API serves, and the first pass put back what the
			// projects want (at boot, before the VMs' units start: their
			// sockets are there), or failed and said why (status shows
			// it). Elsewhere this does nothing.
			daemon.SdNotify(false, daemon.SdNotifyReady)
		}
		if done && c.opts.ExitWhenIdle && c.exitIfIdle() {
			c.log.Info("no project left; controller exits")
			return nil
		}
		var stop, reload bool
		full, stop, reload = c.nextPass(ctx, changes, resync.C, logs.C, hup, reloadAgain)
		reloadWanted = reloadWanted || reload
		if stop {
			c.closeNetworks()
			c.log.Info("controller stopped; helpers keep running")
			return nil
		}
	}
}

// resyncShare bounds the resync's share of the controller's time: the
// next comes resyncShare full passes' time after the last at the least.
const resyncShare = 20

// resyncAfter is when the next resync comes after a full pass that took
// pass: every period, or resyncShare times the pass if that is longer.
// A full pass checks every helper and network; at 10,000 VMs it took
// about 4.6 s of CPU, and one every 30 s kept 15% of a CPU busy with a
// fleet that did nothing. Drift the kernel reports (a link, a table
// changed) is repaired at once whatever this says (the watch); the
// resync is the backstop for the rest, at most 5% of the time.
func resyncAfter(period, pass time.Duration) time.Duration {
	return max(period, resyncShare*pass)
}

// serve serves the daemon API on the state dir's socket and, unless off,
// the metrics; stop shuts both down.
func (c *Controller) serve() (stop func(), err error) {
	ln, err := c.listen()
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: c.handler(), ReadHeaderTimeout: 5 * time.Second, IdleTimeout: serverIdle,
		ConnContext: withPeerUID}
	go srv.Serve(ln)
	var msrv *http.Server
	if c.opts.MetricsAddr != "off" {
		// A busy port (another state dir's controller) costs the metrics,
		// not the VMs' networks.
		if mln, err := net.Listen("tcp", c.opts.MetricsAddr); err != nil {
			c.log.Warn("not serving metrics", "addr", c.opts.MetricsAddr, "err", err)
		} else {
			msrv = &http.Server{Handler: c.metricsHandler(), ReadHeaderTimeout: 5 * time.Second, IdleTimeout: serverIdle}
			go msrv.Serve(mln)
		}
	}
	return func() {
		if msrv != nil {
			msrv.Close()
		}
		c.gen.close()
		shutCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(shutCtx)
		os.Remove(c.sd.APISocket())
	}, nil
}

// nextPass waits for what starts the next pass and tells whether it is a
// full one (reconcile): not when it was asked for (kick), yes for a
// change seen, the resync, a retry and a reload (hup, or again, when a
// reload waits for the ops lock: reload says to run one first); stop when
// ctx is done. The logs are checked meanwhile: the resync may be long.
func (c *Controller) nextPass(ctx context.Context, changes <-chan struct{}, resync, logs <-chan time.Time, hup <-chan os.Signal, again <-chan time.Time) (full, stop, reload bool) {
	for {
		select {
		case <-ctx.Done():
			return false, true, false
		case <-logs:
			c.mu.Lock()
			c.rotateLogsLocked()
			c.mu.Unlock()
		case <-c.kickc:
			return false, false, false
		case <-changes:
			return true, false, false
		case <-resync:
			return true, false, false
		case <-c.nextRetry():
			return true, false, false
		case <-hup:
			return true, false, true
		case <-again:
			return true, false, true
		}
	}
}

// gcPercent is the controller's GOGC unless the environment sets one. Its
// heap is mostly its state, which lives as long as the helpers (about 10
// kB an attachment); at Go's default of 100 the garbage between two
// collections grows to the size of that state, and the resident set of a
// controller of 10,000 attachments to 217-244 MB; at 50, 174-198 MB, with
// `up` as fast (docs/performance.md, twelfth round).
const gcPercent = 50

// logCheckInterval is how often the controller checks its logs' and the
// helpers' sizes (and rotates them), besides at every reconcile.
const logCheckInterval = 10 * time.Second

// apiSocketTemp is the pattern of the private directory listen binds in.
const apiSocketTemp = ".sock-*"

// listen opens the API socket, usable by root and the configured group. It
// is bound in a new private directory of the state dir (mode 0700, so the
// umask does not matter), given its mode and group there, and only then
// renamed into place: nobody ever finds or reaches it with a wider mode.
func (c *Controller) listen() (net.Listener, error) {
	path := c.sd.APISocket()
	// Stale from a crash: we hold the controller lock.
	stale, _ := filepath.Glob(filepath.Join(filepath.Dir(path), apiSocketTemp))
	for _, d := range stale {
		os.RemoveAll(d)
	}
	dir, err := os.MkdirTemp(filepath.Dir(path), apiSocketTemp)
	if err != nil {
		return nil, fmt.Errorf("daemon API: %w", err)
	}
	defer os.RemoveAll(dir)
	tmp := filepath.Join(dir, filepath.Base(path))
	ln, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, fmt.Errorf("daemon API: %w", err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false) // Run removes the socket
	mode := os.FileMode(0o600)
	if c.opts.Group != "" {
		if gid, err := lookupGroup(c.opts.Group); err == nil {
			os.Chown(tmp, 0, gid)
			mode = 0o660
		} else {
			c.log.Warn("API socket group not found; root only", "group", c.opts.Group, "err", err)
		}
	}
	if err := os.Chmod(tmp, mode); err != nil {
		ln.Close()
		return nil, err
	}
	if err := os.Rename(tmp, path); err != nil {
		ln.Close()
		return nil, fmt.Errorf("daemon API: %w", err)
	}
	return ln, nil
}

// restore loads runtime.json and adopts the helpers that still run. From a
// record it cannot read it starts afresh: the helpers that run are then
// strays, stopped below, and reconcile starts the wanted ones again (a
// helper left running would hold its TAP, and its successor fail).
func (c *Controller) restore() {
	rs, _, err := c.sd.LoadRuntime()
	if err != nil {
		c.log.Warn("cannot read runtime state; starting afresh", "err", err)
		rs = statedir.Runtime{}
	}
	adopted := map[int]bool{}
	for _, rec := range rs.Helpers {
		if rec.Proc.Alive() {
			c.helpers[rec.Key] = c.adopt(rec)
			adopted[rec.Proc.PID] = true
			c.log.Info("adopted running helper", "attachment", rec.Key, "pid", rec.Proc.PID)
		}
	}
	// Helpers a killed controller started but had not recorded yet: stop
	// them; reconcile starts the ones that are wanted again. The records
	// and intents are read after the process table: a helper that a
	// `vmnetctl run` starts meanwhile is recorded (its intent first) by
	// then, not taken for a stray.
	var known map[int]bool
	if strays := helperexec.StrayHelpers(c.sd, func(pid int) bool {
		if known == nil {
			known = helperexec.KnownHelperPIDs(c.sd)
		}
		return adopted[pid] || known[pid]
	}); len(strays) > 0 {
		c.log.Warn("stopping helpers no record accounts for", "count", len(strays))
		helperexec.StopProcesses(strays, c.opts.StopGrace)
	}
	// A dead controller's spares exit when its socket closes, but not one
	// that is stopped, which would hold a hand-over's descriptors (a VM's
	// TAP) for good: they hold nothing else.
	if spares := helperexec.StraySpares(c.sd); len(spares) > 0 {
		c.log.Warn("stopping spare relays of a controller that is gone", "count", len(spares))
		helperexec.StopProcesses(spares, 0)
	}
	if rs.AppliedNetworks != nil {
		if d, err := spec.AppliedDesired(rs); err == nil {
			c.applied, c.appliedN, c.appliedP = d, rs.AppliedNetworks, rs.AppliedProjects
		}
	}
}

func (c *Controller) saveRuntime() {
	rs := statedir.Runtime{AppliedNetworks: c.appliedN, AppliedProjects: c.appliedP}
	rs.Helpers = c.runtimeRecs[:0]
	for _, h := range c.helpers { // (each record a file: in no order)
		if h.rec.Proc.PID > 0 && h.state == ctlapi.StateRunning {
			rs.Helpers = append(rs.Helpers, h.rec)
		}
	}
	if err := c.runtime.Save(c.sd, rs); err != nil {
		c.log.Error("saving runtime state", "err", err)
	}
	// Save copied the records; the list lets go of what it held (a
	// stopped helper's strings are not kept alive).
	clear(rs.Helpers)
	c.runtimeRecs = rs.Helpers[:0]
}

// watchExternal adopts the helper that `vmnetctl run` started for a, once
// run has recorded it; a helper of run's that exited is shown stopped, not
// restarted: its socketpair died with it.
func (c *Controller) watchExternal(a *spec.Attachment, h *helperProc) {
	if h != nil {
		h.state = ctlapi.StateStopped
		return
	}
	recs, err := c.sd.RunHelpers(a.Project)
	if err != nil {
		return
	}
	for _, rec := range recs {
		if rec.Key == a.Key() && rec.Proc.Alive() {
			h := c.adopt(rec)
			h.att = a
			c.helpers[a.Key()] = h
			c.log.Info("watching run's helper", "attachment", a.Key(), "pid", rec.Proc.PID)
		}
	}
}

// setFailed records a helper that could not start, to be retried with backoff.
func (c *Controller) setFailed(a *spec.Attachment, h *helperProc, restarts int, bo Backoff, msg string) {
	if h == nil {
		h = &helperProc{exited: closedChan()}
	}
	h.att = a
	h.rec = launch.NewHelperRecord(a, restarts)
	h.rec.StartedAt = time.Now()
	h.backoff = bo
	h.retryAt = time.Now().Add(h.backoff.Next(0))
	h.state = ctlapi.StateFailed
	h.lastErr = msg
	c.helpers[a.Key()] = h
}

// retryNow makes the failed or exited helpers of project (every
// project's for "") due at once, whatever their backoff: an `up` asked for
// again once the cause is put right (room for tasks, a network fixed)
// tries them now, instead of answering with the error of a try made
// before the fix. A start under way in another pass began before the ask:
// should it fail, it is due at once too (commitLaunches).
func (c *Controller) retryNow(project string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, h := range c.helpers {
		if h.att == nil || (project != "" && h.att.Project != project) {
			continue
		}
		switch h.state {
		case ctlapi.StateFailed, ctlapi.StateBackoff:
			h.retryAt = time.Time{}
		case ctlapi.StateStarting:
			h.retryAsked = true
		}
	}
}

// nextRetry fires when the earliest helper in backoff, or network repair
// that failed, is due.
func (c *Controller) nextRetry() <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	var next time.Time
	for _, h := range c.helpers {
		if (h.state == ctlapi.StateBackoff || h.state == ctlapi.StateFailed) && (next.IsZero() || h.retryAt.Before(next)) {
			next = h.retryAt
		}
	}
	for _, r := range c.repairRetry {
		if next.IsZero() || r.at.Before(next) {
			next = r.at
		}
	}
	if next.IsZero() {
		return nil
	}
	return time.After(max(0, time.Until(next)))
}

func (c *Controller) closeNetworks() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closeNetworksLocked()
}

func (c *Controller) closeNetworksLocked() {
	for id, s := range c.netSockets {
		s.ln.Close() // (its clients' helpers go on, as every helper does)
		delete(c.netSockets, id)
	}
	for id, nw := range c.nets {
		nw.Close()
		delete(c.nets, id)
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func mustMAC(s string) net.HardwareAddr {
	hw, _ := net.ParseMAC(s)
	return hw
}

// genWaiter lets API callers wait for a reconcile that starts after them:
// one that began earlier may have read the state dir before their change.
type genWaiter struct {
	mu      sync.Mutex
	started uint64
	done    uint64
	closed  bool
	ch      chan struct{} // closed and replaced whenever done advances
}

func (g *genWaiter) begin() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.started++
}

func (g *genWaiter) end() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.done++
	g.signal()
}

// close releases every waiter: no reconcile will follow.
func (g *genWaiter) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
	g.signal()
}

func (g *genWaiter) signal() {
	if g.ch != nil {
		close(g.ch)
	}
	g.ch = make(chan struct{})
}

func (g *genWaiter) state() (started, done uint64, closed bool, ch <-chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ch == nil {
		g.ch = make(chan struct{})
	}
	return g.started, g.done, g.closed, g.ch
}

// waitReconcile kicks the loop and waits until a reconcile that started
// after the call has finished (or the controller stopped).
func (c *Controller) waitReconcile(ctx context.Context) error {
	started, _, _, _ := c.gen.state()
	target := started + 1
	c.kick()
	for {
		_, done, closed, ch := c.gen.state()
		if done >= target || closed {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// netOpts are the backend's settings for this state dir's networks.
func (c *Controller) netOpts() backend.NetworkOptions {
	return backend.NetworkOptions{Owner: c.sd.Path, LeaseDir: c.sd.LeasesDir(), Upstreams: c.opts.Upstreams, Log: c.log, OnLease: c.onLease,
		OnEgressDenied: c.onEgressDenied}
}
