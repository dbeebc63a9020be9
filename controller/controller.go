package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/backend"
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
	// StatsInterval is the helpers' --stats-interval.
	StatsInterval time.Duration
	// ReadyTimeout bounds a helper's start; StopGrace its SIGTERM.
	ReadyTimeout time.Duration
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
}

// EnvStatsInterval overrides the default helper stats interval (a Go
// duration such as "500ms"), for tests that watch rates move.
const EnvStatsInterval = "VMNETCTL_STATS_INTERVAL"

// DefaultMetricsAddr is the controller's default Prometheus endpoint.
const DefaultMetricsAddr = "127.0.0.1:9464"

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
	if o.Resync == 0 {
		o.Resync = 30 * time.Second
	}
	if o.StatsInterval == 0 {
		o.StatsInterval = 5 * time.Second
		if d, err := time.ParseDuration(os.Getenv(EnvStatsInterval)); err == nil && d > 0 {
			o.StatsInterval = d
		}
	}
	if o.Version == "" {
		o.Version = buildVersion()
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 15 * time.Second
	}
	if o.StopGrace == 0 {
		o.StopGrace = 5 * time.Second
	}
	if o.Backend == nil {
		o.Backend = DefaultBackend()
	}
	if o.MetricsAddr == "" {
		o.MetricsAddr = DefaultMetricsAddr
	}
	return nil
}

// Controller keeps what runs equal to what the projects in the state dir ask for.
type Controller struct {
	opts Options
	sd   statedir.Dir
	log  *slog.Logger
	be   backend.Backend

	mu       sync.Mutex
	nets     map[string]backend.Network
	paths    api.Paths // networks.yaml's, as last read
	netErrs  map[string]string
	helpers  map[string]*helperProc
	applied  *Desired
	appliedN *statedir.NetworksSnapshot
	appliedP []*statedir.Project
	lastErr  error
	lastOK   time.Time
	started  time.Time

	// Reconcile bookkeeping for metrics.
	reconciles        map[string]uint64 // by result: "success", "error"
	lastReconcileTime time.Duration
	// meters keep each helper's latest stats lines for rates (metrics.go).
	meters map[string]*trafficMeter

	kickc chan struct{}
	gen   genWaiter
}

// New makes a controller; Run starts it.
func New(opts Options) (*Controller, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	return &Controller{opts: opts, sd: opts.StateDir, log: opts.Log, be: opts.Backend,
		nets: map[string]backend.Network{}, netErrs: map[string]string{}, helpers: map[string]*helperProc{},
		reconciles: map[string]uint64{},
		kickc:      make(chan struct{}, 1), started: time.Now()}, nil
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
	defer lock.Unlock()
	c.restore()

	ln, err := c.listen()
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: c.handler(), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	defer func() {
		c.gen.close()
		shutCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(shutCtx)
		os.Remove(c.sd.APISocket())
	}()
	if c.opts.MetricsAddr != "off" {
		// A busy port (another state dir's controller) costs the metrics,
		// not the VMs' networks.
		if mln, err := net.Listen("tcp", c.opts.MetricsAddr); err != nil {
			c.log.Warn("not serving metrics", "addr", c.opts.MetricsAddr, "err", err)
		} else {
			msrv := &http.Server{Handler: c.metricsHandler(), ReadHeaderTimeout: 5 * time.Second}
			go msrv.Serve(mln)
			defer msrv.Close()
		}
	}
	c.log.Info("controller started", "stateDir", c.sd.Path, "pid", os.Getpid(), "metrics", c.opts.MetricsAddr)

	resync := time.NewTicker(c.opts.Resync)
	defer resync.Stop()
	for {
		done, err := c.reconcile(ctx)
		if err != nil {
			c.log.Error("reconcile failed", "err", err)
		}
		if done {
			c.log.Info("no project left; controller exits")
			return nil
		}
		select {
		case <-ctx.Done():
			c.closeNetworks()
			c.log.Info("controller stopped; helpers keep running")
			return nil
		case <-c.kickc:
		case <-resync.C:
		case <-c.nextRetry():
		}
	}
}

// listen opens the API socket, usable by root and the configured group.
func (c *Controller) listen() (net.Listener, error) {
	path := c.sd.APISocket()
	os.Remove(path) // stale from a crash: we hold the controller lock
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("daemon API: %w", err)
	}
	mode := os.FileMode(0o600)
	if c.opts.Group != "" {
		if gid, err := lookupGroup(c.opts.Group); err == nil {
			os.Chown(path, 0, gid)
			mode = 0o660
		} else {
			c.log.Warn("API socket group not found; root only", "group", c.opts.Group, "err", err)
		}
	}
	if err := os.Chmod(path, mode); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// restore loads runtime.json and adopts the helpers that still run.
func (c *Controller) restore() {
	rs, _, err := c.sd.LoadRuntime()
	if err != nil {
		c.log.Warn("cannot read runtime state; starting afresh", "err", err)
		return
	}
	for _, rec := range rs.Helpers {
		if rec.Proc.Alive() {
			c.helpers[rec.Key] = c.adopt(rec)
			c.log.Info("adopted running helper", "attachment", rec.Key, "pid", rec.Proc.PID)
		}
	}
	if rs.AppliedNetworks != nil {
		if nets, err := rs.AppliedNetworks.Load(); err == nil {
			if d, err := ComputeDesired(nets, rs.AppliedProjects); err == nil {
				c.applied, c.appliedN, c.appliedP = d, rs.AppliedNetworks, rs.AppliedProjects
			}
		}
	}
}

func (c *Controller) saveRuntime() {
	rs := statedir.Runtime{AppliedNetworks: c.appliedN, AppliedProjects: c.appliedP}
	for _, key := range sortedKeys(c.helpers) {
		if h := c.helpers[key]; h.rec.Proc.PID > 0 && h.state == StateRunning {
			rs.Helpers = append(rs.Helpers, h.rec)
		}
	}
	if err := c.sd.SaveRuntime(rs); err != nil {
		c.log.Error("saving runtime state", "err", err)
	}
}

// loadDesired reads the projects and networks of the state dir.
func (c *Controller) loadDesired() (*Desired, *statedir.NetworksSnapshot, []*statedir.Project, error) {
	projects, err := c.sd.Projects()
	if err != nil {
		return nil, nil, nil, err
	}
	snap, err := c.sd.Networks()
	if err != nil {
		return nil, nil, nil, err
	}
	if len(projects) == 0 {
		return &Desired{}, snap, nil, nil
	}
	if snap == nil {
		return nil, nil, nil, errors.New("projects exist but no networks.yaml was recorded")
	}
	nets, err := snap.Load()
	if err != nil {
		return nil, nil, nil, err
	}
	c.paths = nets.Paths
	d, err := ComputeDesired(nets, projects)
	return d, snap, projects, err
}

// reconcile makes what runs match the state dir. done is true when no
// project is left and everything was removed.
func (c *Controller) reconcile(ctx context.Context) (done bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen.begin()
	defer c.gen.end()
	began := time.Now()
	defer func() {
		c.lastReconcileTime = time.Since(began)
		if err != nil {
			c.reconciles["error"]++
		} else {
			c.reconciles["success"]++
		}
	}()
	desired, snap, projects, err := c.loadDesired()
	if err != nil {
		// What should exist cannot be known: destroy nothing.
		c.lastErr = fmt.Errorf("reading desired state: %w", err)
		return false, c.lastErr
	}
	owners := map[string]*statedir.Project{}
	for _, p := range projects {
		owners[p.Name] = p
	}
	plan := ComputePlan(c.applied, desired)
	var errs []error

	// 1. Stop the helpers that go away or must be replaced, before their networks.
	gone := map[string]bool{}
	for _, ch := range plan.Attachments {
		if ch.Action == ActionDelete || ch.Action == ActionReplace {
			gone[ch.Key] = true
		}
	}
	for key, h := range c.helpers {
		a := findAttachment(desired, key)
		if a == nil || gone[key] {
			c.log.Info("stopping helper", "attachment", key, "pid", h.rec.Proc.PID)
			c.stopProc(h)
			// The record names the attachment even for an adopted helper.
			rec := &Attachment{Attachment: &api.Attachment{VM: h.rec.VM, Index: h.rec.Index, MAC: h.rec.MAC, Attach: h.rec.Attach}}
			if err := c.be.Cleanup(rec.Attachment); err != nil {
				errs = append(errs, err)
			}
			delete(c.helpers, key)
			os.Remove(c.sd.HelperReadyFile(key))
		}
	}

	// 2. Networks: remove the deleted and replaced, restart the services of
	// those changed in place, start the missing.
	for _, ch := range plan.Networks {
		switch ch.Action {
		case ActionDelete, ActionReplace:
			if nw := c.nets[ch.ID]; nw != nil {
				nw.Close()
				delete(c.nets, ch.ID)
			}
			if err := c.be.RemoveNetwork(ctx, ch.ID, c.netOpts()); err != nil {
				errs = append(errs, fmt.Errorf("removing network %q: %w", ch.ID, err))
			}
			c.log.Info("network removed", "network", ch.ID, "action", ch.Action)
		case ActionUpdate:
			if nw := c.nets[ch.ID]; nw != nil {
				nw.Close()
				delete(c.nets, ch.ID)
			}
		}
	}
	clear(c.netErrs)
	for _, n := range desired.Networks {
		if c.nets[n.ID] != nil {
			continue
		}
		nw, err := c.be.StartNetwork(ctx, n, c.netOpts())
		if err != nil {
			c.netErrs[n.ID] = err.Error()
			errs = append(errs, fmt.Errorf("starting network %q: %w", n.ID, err))
			continue
		}
		c.nets[n.ID] = nw
		c.log.Info("network up", "network", n.ID, "backend", c.be.Name())
	}

	// 3. Names and fixed addresses for DHCP and DNS.
	for _, a := range desired.Attachments {
		if nw := c.nets[a.Network]; nw != nil {
			if err := nw.SetHost(mustMAC(a.MAC), a.VM, a.IP); err != nil {
				errs = append(errs, fmt.Errorf("attachment %s: %w", a.Key(), err))
			}
		}
	}

	// 4. Every desired attachment gets a live helper (level-triggered: this
	// also restarts helpers that died).
	now := time.Now()
	var launches []*launch
	for _, a := range desired.Attachments {
		h := c.helpers[a.Key()]
		if h != nil && !isClosed(h.exited) {
			h.att = a
			h.rec.Project = a.Project
			continue
		}
		if a.External {
			c.watchExternal(a, h)
			continue
		}
		restarts := 0
		var bo Backoff
		if h != nil { // it exited
			restarts = h.rec.Restarts + 1
			bo = h.backoff
			if h.state != StateBackoff && h.state != StateFailed {
				uptime := now.Sub(h.rec.StartedAt)
				h.retryAt = now.Add(bo.Next(uptime))
				h.state = StateBackoff
				h.backoff = bo
				h.lastErr = "helper exited" + logTail(h.logPath, max(0, h.statsOff))
				c.log.Warn("helper exited; restarting", "attachment", a.Key(), "in", h.retryAt.Sub(now).String())
			}
			if now.Before(h.retryAt) {
				continue
			}
			bo = h.backoff
		} else {
			bo = DefaultBackoff()
		}
		n := c.nets[a.Network]
		if n == nil {
			c.setFailed(a, h, restarts, bo, fmt.Sprintf("network %s is not up: %s", a.Network, c.netErrs[a.Network]))
			continue
		}
		owner := owners[a.Project]
		if owner == nil {
			owner = &statedir.Project{UID: -1, GID: -1}
		}
		launches = append(launches, &launch{a: a, n: n.Config(), owner: owner, prev: h, restarts: restarts, bo: bo})
		starting := &helperProc{att: a, exited: closedChan(), state: StateStarting,
			rec: statedir.HelperRecord{Key: a.Key(), VM: a.VM, Index: a.Index, Network: a.Network, Project: a.Project, MAC: a.MAC, Attach: a.Attach, Restarts: restarts}}
		c.helpers[a.Key()] = starting
	}
	// Start the helpers in parallel and without the lock: a slow helper
	// must not hold up status, metrics or the other helpers.
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, l := range launches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.h, l.err = c.launchHelper(ctx, l.a, l.n, l.owner)
		}()
	}
	wg.Wait()
	c.mu.Lock()
	for _, l := range launches {
		if l.err != nil {
			errs = append(errs, l.err)
			c.setFailed(l.a, l.prev, l.restarts, l.bo, l.err.Error())
			continue
		}
		l.h.rec.Restarts = l.restarts
		l.h.backoff = l.bo
		c.helpers[l.a.Key()] = l.h
		c.log.Info("helper running", "attachment", l.a.Key(), "network", l.a.Network, "pid", l.h.rec.Proc.PID, "restarts", l.restarts)
	}

	c.applied, c.appliedN, c.appliedP = desired, snap, projects
	c.saveRuntime()
	c.lastErr = errors.Join(errs...)
	if c.lastErr == nil {
		c.lastOK = time.Now()
	}
	if len(projects) == 0 {
		c.closeNetworksLocked()
		removed, err := c.be.Sweep(ctx, c.netOpts())
		if err != nil {
			c.log.Warn("sweep", "err", err)
		} else if len(removed) > 0 {
			c.log.Info("swept leftovers", "removed", removed)
		}
		// Nothing runs: remove what the state dir held for it.
		c.sd.RemoveRuntime()
		return true, c.lastErr
	}
	return false, c.lastErr
}

// launch is a helper start that reconcile runs without the lock.
type launch struct {
	a        *Attachment
	n        *api.Network
	owner    *statedir.Project
	prev     *helperProc
	restarts int
	bo       Backoff
	h        *helperProc
	err      error
}

// watchExternal adopts the helper that `vmnetctl run` started for a, once
// run has recorded it; a helper of run's that exited is shown stopped, not
// restarted: its socketpair died with it.
func (c *Controller) watchExternal(a *Attachment, h *helperProc) {
	if h != nil {
		h.state = StateStopped
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
func (c *Controller) setFailed(a *Attachment, h *helperProc, restarts int, bo Backoff, msg string) {
	if h == nil {
		h = &helperProc{exited: closedChan()}
	}
	h.att = a
	h.rec = statedir.HelperRecord{Key: a.Key(), VM: a.VM, Index: a.Index, Network: a.Network, Project: a.Project, MAC: a.MAC, Attach: a.Attach, Restarts: restarts, StartedAt: time.Now()}
	h.backoff = bo
	h.retryAt = time.Now().Add(h.backoff.Next(0))
	h.state = StateFailed
	h.lastErr = msg
	c.helpers[a.Key()] = h
}

// nextRetry fires when the earliest helper in backoff is due.
func (c *Controller) nextRetry() <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	var next time.Time
	for _, h := range c.helpers {
		if (h.state == StateBackoff || h.state == StateFailed) && (next.IsZero() || h.retryAt.Before(next)) {
			next = h.retryAt
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
	for id, nw := range c.nets {
		nw.Close()
		delete(c.nets, id)
	}
}

func findAttachment(d *Desired, key string) *Attachment {
	i := slices.IndexFunc(d.Attachments, func(a *Attachment) bool { return a.Key() == key })
	if i < 0 {
		return nil
	}
	return d.Attachments[i]
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
	return backend.NetworkOptions{LeaseDir: c.sd.LeasesDir(), Upstreams: c.opts.Upstreams, Log: c.log}
}
