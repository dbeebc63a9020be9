package controller

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"math"
	"net"
	"os"
	"slices"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/backend"
	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/helperexec"
	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/launch"
	"github.com/vmnetctl/vmnetctl/nettypes"
	"github.com/vmnetctl/vmnetctl/procid"
	"github.com/vmnetctl/vmnetctl/spec"
	"github.com/vmnetctl/vmnetctl/statedir"
	"golang.org/x/sync/errgroup"
)

// reconcile makes what runs match the state dir, level-triggered and
// recomputed from scratch each time: read what should run and plan (under
// the lock); stop what goes (without it, in parallel); repair the networks
// that drifted (without it: status shows them degraded meanwhile); converge
// the networks; start missing helpers (without the lock, in parallel); commit
// (under the lock). done is true when no project is left and everything
// was removed.
//
// A full pass also checks every running VM's port (ensurePorts): the first
// pass, the resync, a change seen behind the controller's back, a retry.
// A pass asked for (up, down, a helper that ended) checks the ports of the
// networks it started or repaired only: the rest did not change, and
// reading a thousand ports would make each VM's attach cost as much as the
// VMs already there.
func (c *Controller) reconcile(ctx context.Context, full bool) (done bool, err error) {
	c.gen.begin()
	defer c.gen.end()
	defer c.countReconcile(time.Now(), &err)
	c.progress.enter("desired")
	defer c.progress.enter("")

	c.mu.Lock()
	c.rotateLogsDueLocked()
	desired, snap, projects, err := c.loadDesired()
	if err != nil {
		// What should exist cannot be known: destroy nothing.
		c.lastErr = fmt.Errorf("reading desired state: %w", err)
		err = c.lastErr
		c.mu.Unlock()
		return false, err
	}
	plan := spec.ComputePlan(c.applied, desired)
	touched := newPortScope(plan, full)
	var settle settledPass
	if full {
		if settle = c.settle.begin(c.portsDigest(desired)); settle.quiet {
			touched.settle()
		}
	}
	stopping := c.takeStopping(plan, desired)
	c.mu.Unlock()

	c.progress.enter("stop")
	errs := c.stopHelpers(stopping)
	c.progress.enter("repair")
	errs = append(errs, c.repairNetworks(ctx, plan, desired, touched)...)

	c.mu.Lock()
	defer c.mu.Unlock()
	c.progress.enter("networks")
	errs = append(errs, c.convergeNetworks(ctx, plan, desired, touched)...)
	errs = append(errs, c.ensureNetSockets(desired)...)
	errs = append(errs, c.sweepStrays(ctx, desired, projects)...)
	// What the guards hold of the VMs (their names' bindings, partitions,
	// impairments: elements and rules of vmnetctl tables) is written
	// again by a full pass, which puts back what changed behind the
	// controller's back; but not by one whose ports settled, since the
	// kernel said nothing of those tables (and a write every pass would
	// be a notice every pass: nothing would settle).
	rewrite := full && !touched.settled
	c.progress.enter("names")
	errs = append(errs, c.setHosts(desired, rewrite)...)
	c.progress.enter("partitions")
	errs = append(errs, c.setPartitions(desired, rewrite)...)
	c.progress.enter("forwards")
	errs = append(errs, c.setForwards(ctx, desired)...)
	c.progress.enter("claims")
	claimErrs := c.claimPorts(ctx, desired, plan, touched)
	errs = append(errs, claimErrs...)
	c.progress.enter("start")
	launches := c.planLaunches(desired, projects)
	c.mu.Unlock()
	c.runLaunches(ctx, launches)
	c.mu.Lock()
	errs = append(errs, c.commitLaunches(launches)...)
	c.progress.enter("bandwidth")
	errs = append(errs, c.setBandwidth(ctx, desired, full)...)
	c.progress.enter("impair")
	errs = append(errs, c.setImpairments(desired, rewrite)...)
	errs = append(errs, c.setShapings(desired, full)...)
	c.progress.enter("ports")
	portErrs := c.ensurePorts(ctx, desired, touched)
	errs = append(errs, portErrs...)
	if full {
		c.settle.end(settle, len(claimErrs)+len(portErrs) == 0)
	}
	c.progress.enter("commit")
	return c.commit(ctx, desired, snap, projects, errs)
}

// sweepStrays removes the networks of this state dir that run but are
// neither desired nor recorded, once after the controller starts and after
// a removal failed: a network made just before a crash, whose project went
// before the next controller's first pass, is recorded nowhere (the plan
// only removes what runtime.json recorded). With no project left, commit
// sweeps everything. Call with c.mu held.
func (c *Controller) sweepStrays(ctx context.Context, desired *spec.Desired, projects []*statedir.Project) []error {
	if !c.strays || len(projects) == 0 {
		return nil
	}
	keep := make([]string, 0, len(desired.Networks))
	for _, n := range desired.Networks {
		keep = append(keep, n.ID)
	}
	removed, err := c.be.Sweep(ctx, keep, c.netOpts())
	if len(removed) > 0 {
		c.log.Info("removed networks that no project wants", "networks", removed)
		for _, id := range removed {
			c.emit(ctlapi.Event{Kind: "network-removed", Network: id, Detail: "stray"})
		}
	}
	if err != nil {
		return []error{fmt.Errorf("removing networks that no project wants: %w", err)}
	}
	c.strays = false
	return nil
}

// countReconcile counts a reconcile that began at began, for the metrics.
func (c *Controller) countReconcile(began time.Time, err *error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lastReconcileTime = time.Since(began)
	if *err != nil {
		c.reconciles["error"]++
	} else {
		c.reconciles["success"]++
	}
}

// loadDesired reads the projects and networks of the state dir.
func (c *Controller) loadDesired() (*spec.Desired, *statedir.NetworksSnapshot, []*statedir.Project, error) {
	projects, err := c.projects.Projects(c.sd)
	if err != nil {
		return nil, nil, nil, err
	}
	projects = c.dropGoneHolders(projects)
	snap, err := c.sd.Networks()
	if err != nil {
		return nil, nil, nil, err
	}
	if len(projects) == 0 {
		return &spec.Desired{}, snap, nil, nil
	}
	if snap == nil {
		return nil, nil, nil, errors.New("projects exist but no networks.yaml was recorded")
	}
	nets, err := c.loadNetworks(snap)
	if err != nil {
		return nil, nil, nil, err
	}
	// The helpers' copy, in the state dir (after a reboot, only the
	// snapshot is left).
	if err := c.sd.EnsureNetworksYAML(snap); err != nil {
		return nil, nil, nil, err
	}
	c.paths = nets.Paths
	c.parseMu.Lock()
	d, err := c.resolver.Resolve(nets, projects, c.keptMACsLocked())
	c.parseMu.Unlock()
	return d, snap, projects, err
}

// loadNetworks is snap parsed, the networks parsed last while snap is
// the same: the desired state's resolver resolves only what changed
// against the same networks, and a check parses none. Call without
// parseMu held.
func (c *Controller) loadNetworks(snap *statedir.NetworksSnapshot) (*api.Networks, error) {
	c.parseMu.Lock()
	defer c.parseMu.Unlock()
	if c.netsOf.nets != nil && snap.Same(c.netsOf.snap) {
		return c.netsOf.nets, nil
	}
	nets, err := snap.Load()
	if err != nil {
		return nil, err
	}
	c.netsOf.snap, c.netsOf.nets = *snap, nets
	return nets, nil
}

// keptMACsLocked is the MACs the helpers run with, by attachment key
// (spec.KeptMACs of their records), read off the helpers in place: a
// pass copies no record. Call with c.mu held.
func (c *Controller) keptMACsLocked() map[string]string {
	keep := make(map[string]string, len(c.helpers))
	for _, h := range c.helpers {
		spec.KeepMAC(keep, &h.rec)
	}
	return keep
}

// dropGoneHolders deletes the projects whose holder process is gone (a
// helper that brought its network up and exited): what they held up goes
// once nothing else needs it.
func (c *Controller) dropGoneHolders(projects []*statedir.Project) []*statedir.Project {
	return slices.DeleteFunc(projects, func(p *statedir.Project) bool {
		if p.Holder == nil {
			return false
		}
		if p.Holder.Alive() {
			// Reconcile again the moment it exits (in the poller, on
			// its pidfd).
			if !c.watchedHolders[p.Holder.PID] {
				c.watchedHolders[p.Holder.PID] = true
				go func(id procid.Identity) {
					id.WaitExit()
					c.kick()
				}(*p.Holder)
			}
			return false
		}
		delete(c.watchedHolders, p.Holder.PID)
		// Only if it is still that process's: a `vmnetctl run` started
		// again since has saved a project of the same name.
		if dropped, _ := c.sd.DeleteProjectHeldBy(p.Name, *p.Holder); !dropped {
			return false
		}
		c.log.Info("the process holding project is gone; dropped it", "project", p.Name, "pid", p.Holder.PID)
		// A `vmnetctl run` that was killed: its helpers are watched
		// (adopted), and stop now as any helper whose attachment goes.
		c.sd.RemoveRunHelpers(p.Name)
		return true
	})
}

// takeStopping takes the helpers that go away or must be replaced out of
// the supervised set; the caller stops them.
func (c *Controller) takeStopping(plan *spec.Plan, desired *spec.Desired) []*helperProc {
	gone := map[string]bool{}
	for _, ch := range plan.Attachments {
		if ch.Action == spec.ActionDelete || ch.Action == spec.ActionReplace {
			gone[ch.Key] = true
		}
	}
	wanted := make(map[string]bool, len(desired.Attachments))
	for _, a := range desired.Attachments {
		wanted[a.Key()] = true
	}
	var out []*helperProc
	for key, h := range c.helpers {
		h.leaving = !wanted[key]
		if h.leaving || gone[key] {
			c.markPortGone(h.rec)
			h.stopped.Store(true)
			out = append(out, h)
			delete(c.helpers, key)
		}
	}
	return out
}

// stopHelpers stops helpers in parallel, before their networks go, and
// removes what a killed one may have left.
func (c *Controller) stopHelpers(hs []*helperProc) []error {
	errs := make([]error, len(hs))
	var g errgroup.Group
	g.SetLimit(helperexec.StopWorkers)
	for i, h := range hs {
		g.Go(func() error {
			c.log.Info("stopping helper", "attachment", h.rec.Key, "pid", h.rec.Proc.PID)
			c.stopProc(h)
			// The record names the attachment even for an adopted helper.
			errs[i] = c.be.Cleanup(&api.Attachment{VM: h.rec.VM, Index: h.rec.Index, MAC: h.rec.MAC, Attach: h.rec.Attach})
			c.sd.RemoveHelperFiles(h.rec.Key)
			if h.leaving && h.rec.Socket != "" {
				// A killed (or hung, then killed) helper leaves its socket
				// and lock; its VM's folder goes once empty.
				launch.RemoveSocket(h.rec.Socket)
				os.Remove(c.sd.VMDir(h.rec.VM))
			}
			return nil
		})
	}
	g.Wait()
	return errs
}

// convergeNetworks removes the deleted and replaced networks, restarts the
// services of those changed in place, and starts the missing (but those
// repairNetworks keeps trying to repair).
func (c *Controller) convergeNetworks(ctx context.Context, plan *spec.Plan, desired *spec.Desired, touched *portScope) []error {
	var errs []error
	for _, ch := range plan.Networks {
		if ch.Action == spec.ActionCreate {
			continue
		}
		if nw := c.nets[ch.ID]; nw != nil {
			nw.Close()
			delete(c.nets, ch.ID)
		}
		if ch.Action == spec.ActionDelete || ch.Action == spec.ActionReplace {
			if err := c.be.RemoveNetwork(ctx, ch.ID, c.netOpts()); err != nil {
				errs = append(errs, fmt.Errorf("removing network %q: %w", ch.ID, err))
				c.strays = true // (it is recorded as gone: swept below)
			}
			c.log.Info("network removed", "network", ch.ID, "action", ch.Action)
			c.emit(ctlapi.Event{Kind: "network-removed", Network: ch.ID, Detail: string(ch.Action)})
		}
	}
	for _, n := range desired.Networks {
		if c.nets[n.ID] != nil || c.degraded[n.ID] != "" {
			continue // running, or being repaired (repairNetworks)
		}
		nw, err := c.be.StartNetwork(ctx, n, c.netOpts())
		if err != nil {
			c.netErrs[n.ID] = err.Error()
			errs = append(errs, fmt.Errorf("starting network %q: %w", n.ID, err))
			continue
		}
		c.nets[n.ID] = nw
		touched.add(n.ID)
		c.log.Info("network up", "network", n.ID, "backend", c.be.Name())
		c.emit(ctlapi.Event{Kind: "network-up", Network: n.ID})
	}
	return errs
}

// repairNetworks checks the running networks that the plan leaves as they
// are against what they should be (those in the pass's checkScope), and
// repairs those that drifted (repairNetwork), with c.mu not held: status and metrics answer, and show
// the network degraded, while its kernel state is put back. A network
// whose repair failed is retried here on every pass until it succeeds.
func (c *Controller) repairNetworks(ctx context.Context, plan *spec.Plan, desired *spec.Desired, touched *portScope) []error {
	changed := map[string]bool{}
	for _, ch := range plan.Networks {
		changed[ch.ID] = true
	}
	checked := checkScope(plan, touched.all || touched.settled)
	type job struct {
		n  *api.Network
		nw backend.Network
	}
	var jobs []job
	c.mu.Lock()
	clear(c.netErrs)
	for id := range c.degraded {
		if changed[id] || !slices.ContainsFunc(desired.Networks, func(n *api.Network) bool { return n.ID == id }) {
			delete(c.degraded, id) // removed or started anew by convergeNetworks
			delete(c.repairRetry, id)
		}
	}
	now := time.Now()
	for _, n := range desired.Networks {
		if changed[n.ID] {
			continue
		}
		nw, drift := c.nets[n.ID], c.degraded[n.ID]
		if r := c.repairRetry[n.ID]; nw == nil && r != nil && now.Before(r.at) {
			// A repair failed: try again after its backoff (nextRetry),
			// not on every event (a failed repair's own undoing is one).
			c.netErrs[n.ID] = r.err
			continue
		}
		if (nw != nil && checked(n.ID)) || drift != "" {
			jobs = append(jobs, job{n, nw})
		}
	}
	c.mu.Unlock()
	var errs []error
	for _, j := range jobs {
		if err := c.repairNetwork(ctx, j.n, j.nw, touched); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// checkScope tells which running networks a pass checks for drift: all
// of them in a full pass, and in a pass asked for that changes nothing
// (an `up` run again to put things right); none in a pass asked for that
// changes attachments (a fleet's VM attached or detached): the check runs
// nft, 5 to 7 ms a network, and drift there is found by the events (at
// once) and the resync. Degraded networks are repaired on any pass.
func checkScope(plan *spec.Plan, full bool) func(id string) bool {
	all := full || plan.Empty()
	return func(string) bool { return all }
}

// repairRetry is when a network whose repair failed is repaired again.
type repairRetry struct {
	bo  Backoff
	at  time.Time
	err string
}

// repairNetwork checks network n, running as nw, against what it should be
// (its bridge, addresses, nftables tables: the backend's CheckNetwork; its
// services: Health) and, if something was changed behind the controller's
// back, starts it again: the kernel state is put back and its services
// bound anew. The network is published degraded, with the reason, before
// the repair starts, and stays so (with the repair's error) until a repair
// succeeds. nw is nil when an earlier repair failed (the network stays
// degraded for the drift found then): the repair is tried again. Called
// without c.mu.
func (c *Controller) repairNetwork(ctx context.Context, n *api.Network, nw backend.Network, touched *portScope) error {
	if nw != nil {
		err := c.be.CheckNetwork(ctx, n, c.netOpts())
		if err == nil {
			err = nw.Health()
		}
		if backend.OnlyFRR(err) {
			return c.repairFRR(ctx, n, err)
		}
		if err == nil {
			c.mu.Lock()
			delete(c.degraded, n.ID)
			c.mu.Unlock()
			return nil
		}
		drift := err.Error()
		c.mu.Lock()
		c.degraded[n.ID] = drift
		delete(c.nets, n.ID)
		c.mu.Unlock()
		c.log.Warn("network changed behind vmnetctl's back; repairing", "network", n.ID, "drift", drift)
		c.emit(ctlapi.Event{Kind: "drift-found", Network: n.ID, Detail: drift})
		nw.Close()
	}
	touched.add(n.ID) // its ports are checked after the repair
	nw, err := c.be.StartNetwork(ctx, n, c.netOpts())
	var still error
	if err == nil {
		still = c.be.CheckNetwork(ctx, n, c.netOpts())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		r := c.repairRetry[n.ID]
		if r == nil {
			r = &repairRetry{bo: Backoff{First: time.Second, Max: 15 * time.Second, Healthy: time.Duration(math.MaxInt64)}}
			c.repairRetry[n.ID] = r
		}
		r.at, r.err = time.Now().Add(r.bo.Next(0)), err.Error()
		c.netErrs[n.ID] = r.err
		return fmt.Errorf("repairing network %q: %w", n.ID, err)
	}
	delete(c.repairRetry, n.ID)
	c.nets[n.ID] = nw
	if still != nil {
		c.degraded[n.ID] = still.Error()
		return fmt.Errorf("network %q is still not as configured after a repair: %w", n.ID, still)
	}
	delete(c.degraded, n.ID)
	c.repairs[n.ID]++
	c.log.Info("network repaired", "network", n.ID)
	c.emit(ctlapi.Event{Kind: "drift-repaired", Network: n.ID})
	return nil
}

// repairFRR repairs what CheckNetwork found wrong (found) in network n's
// FRR part alone (backend.FRRError: FRR lost its configuration, or does
// not answer): FRR is given the network's configuration again, and the
// network, whose services the VMs here need whatever FRR does, keeps
// running; it is degraded, with the reason, until FRR takes it. Called
// without c.mu.
func (c *Controller) repairFRR(ctx context.Context, n *api.Network, found error) error {
	c.mu.Lock()
	if c.degraded[n.ID] == "" {
		c.log.Warn("FRR lacks the network's EVPN configuration, or does not answer; repairing that alone", "network", n.ID, "drift", found.Error())
		c.emit(ctlapi.Event{Kind: "drift-found", Network: n.ID, Detail: found.Error()})
	}
	c.degraded[n.ID] = found.Error()
	c.mu.Unlock()
	err := found
	if fe, ok := c.be.(backend.FRREnsurer); ok && !backend.FRRUnreachable(found) {
		if err = fe.EnsureFRR(ctx, n, c.netOpts()); err == nil {
			err = c.be.CheckNetwork(ctx, n, c.netOpts())
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.degraded[n.ID] = err.Error()
		return nil // status says it; the next check tries again
	}
	delete(c.degraded, n.ID)
	c.repairs[n.ID]++
	c.log.Info("network's FRR part repaired", "network", n.ID)
	c.emit(ctlapi.Event{Kind: "drift-repaired", Network: n.ID})
	return nil
}

// portScope is the networks whose VM ports a pass checks (ensurePorts):
// all of them in a full pass, else those it started or repaired.
type portScope struct {
	all bool
	ids map[string]bool
	// settled: a full pass whose ports are as the last that read them
	// left them (settled): it checks them as a pass asked for does, and
	// reads no network's claims again that it did not start or repair.
	settled bool
}

// newPortScope is the scope of a pass, full or not, before it starts or
// repairs any network: the networks the plan changes.
func newPortScope(plan *spec.Plan, full bool) *portScope {
	s := &portScope{all: full, ids: map[string]bool{}}
	for _, ch := range plan.Networks {
		s.add(ch.ID)
	}
	return s
}

func (s *portScope) add(id string)      { s.ids[id] = true }
func (s *portScope) has(id string) bool { return s.all || s.ids[id] }

// settle makes a full pass's scope that of a settled one.
func (s *portScope) settle() { s.all, s.settled = false, true }

// ensurePorts gives the running helpers' ports back what a repair of their
// network (or a change behind the controller's back) took: their place on
// the bridge and their guard. Only the networks in scope.
func (c *Controller) ensurePorts(ctx context.Context, desired *spec.Desired, scope *portScope) []error {
	byNet := map[string][]backend.Port{}
	for network, p := range c.runningPorts(desired) {
		if scope.has(network) {
			byNet[network] = append(byNet[network], p)
		}
	}
	var errs []error
	for _, n := range desired.Networks {
		if c.nets[n.ID] == nil || len(byNet[n.ID]) == 0 {
			continue
		}
		if err := c.be.EnsurePorts(ctx, n, byNet[n.ID]); err != nil {
			errs = append(errs, fmt.Errorf("network %q: repairing VM ports: %w", n.ID, err))
		}
	}
	return errs
}

// runningPorts yields the ports of desired's attachments whose helpers
// run, with their networks. Call with c.mu held.
func (c *Controller) runningPorts(desired *spec.Desired) iter.Seq2[string, backend.Port] {
	return func(yield func(string, backend.Port) bool) {
		for _, a := range desired.Attachments {
			h := c.helpers[a.Key()]
			if h == nil || h.state != ctlapi.StateRunning || h.rec.Tap == "" {
				continue
			}
			p := backend.Port{Name: h.rec.Tap, SpoofCheck: a.SpoofCheck()}
			if mac := a.PinnedMAC(); mac != "" {
				p.MAC = mustMAC(mac)
			}
			if !yield(a.Network, p) {
				return
			}
		}
	}
}

// claimPorts reserves, on each running network, its attachments' MACs for
// their ports, before their helpers start: no other VM's port may take
// one, even before its own VM sent a frame. The networks in scope (a full
// pass: all), and all in a pass that changes nothing (an `up` run again
// to put things right), have their claims read from the kernel; the rest
// are changed from what the controller last wrote. A network whose
// attachments the plan leaves as they are, none of whose ports went,
// and whose last claims succeeded, is not asked at all (claimed): one
// VM's attach or detach costs its own network's claims, not those of
// every network of the fleet.
func (c *Controller) claimPorts(ctx context.Context, desired *spec.Desired, plan *spec.Plan, scope *portScope) []error {
	changed := map[string]*nettypes.ClaimChanges{} // networks whose attachments change, and how
	for _, ch := range plan.Attachments {
		if a := ch.Old; a != nil {
			cc := changedOf(changed, a.Network)
			cc.Removed = append(cc.Removed, a.Attachment)
		}
		if a := ch.New; a != nil {
			cc := changedOf(changed, a.Network)
			cc.Added = append(cc.Added, a.Attachment)
		}
	}
	if c.claimed == nil {
		c.claimed = map[string]bool{}
	}
	claims := map[string]backend.ClaimOptions{} // the networks to claim
	for _, n := range desired.Networks {
		if c.nets[n.ID] == nil {
			continue // (and claimed anew once it runs: below)
		}
		o := backend.ClaimOptions{Reread: plan.Empty() && !scope.settled || scope.has(n.ID)}
		g := c.portsGone[n.ID]
		if g != nil {
			o.PortsGone, o.GonePorts = g.unknown, g.indexes
		}
		if c.claimed[n.ID] && changed[n.ID] != nil && !o.Reread && !o.PortsGone {
			// Its last claims succeeded, and since then the plans of
			// the passes (each from the last's desired state, which
			// commit keeps) changed these alone: a network that missed
			// a pass's claims is not claimed (not running, forgotten
			// below), or failed them.
			o.Changed = changed[n.ID]
		}
		if o.Reread || g != nil || changed[n.ID] != nil || !c.claimed[n.ID] {
			claims[n.ID] = o
		}
	}
	byNet := map[string][]*api.Attachment{}
	for _, a := range desired.Attachments {
		if _, ok := claims[a.Network]; ok {
			byNet[a.Network] = append(byNet[a.Network], a.Attachment)
		}
	}
	var errs []error
	for _, n := range desired.Networks {
		o, ok := claims[n.ID]
		if !ok {
			continue
		}
		err := c.be.ClaimPorts(ctx, n, byNet[n.ID], o)
		c.claimed[n.ID] = err == nil
		if err != nil {
			errs = append(errs, fmt.Errorf("network %q: claiming the VMs' MACs: %w", n.ID, err))
			continue
		}
		delete(c.portsGone, n.ID)
	}
	for id := range c.claimed {
		if c.nets[id] == nil || desired.Network(id) == nil {
			delete(c.claimed, id) // claimed anew once it runs again
		}
	}
	for id := range c.portsGone {
		if desired.Network(id) == nil { // gone with its guard
			delete(c.portsGone, id)
		}
	}
	return errs
}

// changedOf is m's entry for network id, added if missing.
func changedOf(m map[string]*nettypes.ClaimChanges, id string) *nettypes.ClaimChanges {
	cc := m[id]
	if cc == nil {
		cc = &nettypes.ClaimChanges{}
		m[id] = cc
	}
	return cc
}

// helperLaunch is a helper start that reconcile runs without the lock.
type helperLaunch struct {
	a        *spec.Attachment
	n        *api.Network
	owner    *statedir.Project
	prev     *helperProc
	restarts int
	bo       Backoff
	h        *helperProc
	err      error
}

// planLaunches gives every desired attachment a live helper
// (level-triggered: this also restarts helpers that died, after their
// backoff). Those to start are marked starting and returned.
func (c *Controller) planLaunches(desired *spec.Desired, projects []*statedir.Project) []*helperLaunch {
	owners := map[string]*statedir.Project{}
	for _, p := range projects {
		owners[p.Name] = p
	}
	now := time.Now()
	var launches []*helperLaunch
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
		restarts, bo, due := c.restartDue(a, h, now)
		if !due {
			continue
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
		launches = append(launches, &helperLaunch{a: a, n: n.Config(), owner: owner, prev: h, restarts: restarts, bo: bo})
		c.helpers[a.Key()] = &helperProc{att: a, exited: closedChan(), state: ctlapi.StateStarting, rec: launch.NewHelperRecord(a, restarts)}
	}
	return launches
}

// restartDue tells whether a's helper h (nil if it never ran) should start
// now, with its restart count and backoff. A helper that exited enters its
// backoff here.
func (c *Controller) restartDue(a *spec.Attachment, h *helperProc, now time.Time) (restarts int, bo Backoff, due bool) {
	if h == nil {
		return 0, DefaultBackoff(), true
	}
	restarts = h.rec.Restarts + 1
	if h.state != ctlapi.StateBackoff && h.state != ctlapi.StateFailed {
		uptime := now.Sub(h.rec.StartedAt)
		h.retryAt = now.Add(h.backoff.Next(uptime))
		h.state = ctlapi.StateBackoff
		h.lastErr = "helper exited" + logTail(h.logPath, max(0, h.statsOff))
		c.log.Warn("helper exited; restarting", "attachment", a.Key(), "in", h.retryAt.Sub(now).String())
		c.emit(ctlapi.Event{Kind: "helper-exited", Network: a.Network, Attachment: a.Key(), PID: h.rec.Proc.PID, Detail: h.lastErr})
	}
	return restarts, h.backoff, !now.Before(h.retryAt)
}

// runLaunches starts the helpers without the lock (a slow helper must
// not hold up status, metrics or the other helpers), launchWorkers at a
// time.
func (c *Controller) runLaunches(ctx context.Context, launches []*helperLaunch) {
	c.progress.begin(len(launches))
	// The head of a long plan starts first, never starved by its tail;
	// the goroutines are at most launchWorkers, whatever the plan's length.
	var g errgroup.Group
	g.SetLimit(launchWorkers())
	for _, l := range launches {
		g.Go(func() error {
			c.progress.start(l.a.Key())
			l.h, l.err = c.launchHelper(ctx, l.a, l.n, l.owner)
			c.progress.done(l.a.Key(), l.err)
			return nil
		})
	}
	g.Wait()
}

// commitLaunches records the helpers that started and the failures.
func (c *Controller) commitLaunches(launches []*helperLaunch) []error {
	var errs []error
	for _, l := range launches {
		if l.err != nil {
			errs = append(errs, l.err)
			asked := c.helpers[l.a.Key()] != nil && c.helpers[l.a.Key()].retryAsked
			c.setFailed(l.a, l.prev, l.restarts, l.bo, l.err.Error())
			if asked {
				c.helpers[l.a.Key()].retryAt = time.Time{}
			}
			c.emit(ctlapi.Event{Kind: "helper-failed", Network: l.a.Network, Attachment: l.a.Key(), Detail: l.err.Error()})
			continue
		}
		l.h.rec.Restarts = l.restarts
		l.h.backoff = l.bo
		c.helpers[l.a.Key()] = l.h
		c.log.Info("helper running", "attachment", l.a.Key(), "network", l.a.Network, "pid", l.h.rec.Proc.PID, "restarts", l.restarts)
		c.emit(ctlapi.Event{Kind: "helper-started", Network: l.a.Network, Attachment: l.a.Key(), MAC: l.a.MAC, PID: l.h.rec.Proc.PID, Detail: fmt.Sprintf("restarts=%d", l.restarts)})
	}
	return errs
}

// commit records what was applied. With no project left it removes every
// network and what the state dir held for them, and reports done.
func (c *Controller) commit(ctx context.Context, desired *spec.Desired, snap *statedir.NetworksSnapshot, projects []*statedir.Project, errs []error) (bool, error) {
	c.applied, c.appliedN, c.appliedP = desired, snap, projects
	c.appliedView.Store(desired)
	c.saveRuntime()
	c.lastErr = errors.Join(errs...)
	if c.lastErr == nil {
		c.lastOK = time.Now()
	}
	if len(projects) > 0 {
		return false, c.lastErr
	}
	c.closeNetworksLocked()
	// No VM left to start: no spare kept, and none left running once the
	// `down` that asked for this pass returns.
	c.spares.Drain()
	removed, err := c.be.Sweep(ctx, nil, c.netOpts())
	if err != nil {
		c.log.Warn("sweep", "err", err)
	} else if len(removed) > 0 {
		c.log.Info("swept leftovers", "removed", removed)
	}
	if removed, err := c.sd.RemoveRuntimeIfNoProjects(); !removed {
		// A project was saved since this pass read them (`up` running
		// beside a controller with none): the next pass, which up asks
		// for, makes its networks again.
		return false, errors.Join(c.lastErr, err)
	}
	return true, c.lastErr
}

// bandwidthSet is what setBandwidth last set on an attachment's port: the
// helper (a new one has a new port), the port and the limits.
type bandwidthSet struct {
	pid   int
	start uint64 // the helper's start time: a pid is used again
	tap   string
	b     api.Bandwidth
}

// setBandwidth gives each running helper's port its attachment's limits
// (backend.Shaper): a pass asked for sets those new or changed since the
// last (bandwidthSet), and takes off those no longer wanted; a full pass
// sets every limit again, which puts back one changed behind the
// controller's back. Ports that have and had no limit are not touched,
// but on the controller's first pass, which does not know what an
// earlier controller set: there every running port is given its limits
// or none. A limit that could not be set or taken off is tried again.
func (c *Controller) setBandwidth(ctx context.Context, desired *spec.Desired, full bool) []error {
	sh, ok := c.be.(backend.Shaper)
	if !ok {
		return nil // (the backend's Limits said so)
	}
	var errs []error
	first := c.bandwidth == nil
	set := make(map[string]bandwidthSet)
	for _, a := range desired.Attachments {
		h := c.helpers[a.Key()]
		if h == nil || h.state != ctlapi.StateRunning || h.rec.Tap == "" {
			continue
		}
		want := bandwidthSet{pid: h.rec.Proc.PID, start: h.rec.Proc.StartTime, tap: h.rec.Tap}
		if a.Bandwidth != nil {
			want.b = *a.Bandwidth
		}
		prev, had := c.bandwidth[a.Key()]
		switch {
		case had && prev == want && !(full && a.Bandwidth != nil):
			set[a.Key()] = want
			continue
		case !had && a.Bandwidth == nil && !first:
			continue
		}
		if err := sh.SetBandwidth(ctx, h.rec.Tap, a.Bandwidth); err != nil {
			errs = append(errs, fmt.Errorf("attachment %s: %w", a.Key(), err))
			set[a.Key()] = bandwidthSet{} // unknown: tried again next pass
			continue
		}
		if a.Bandwidth != nil {
			set[a.Key()] = want
		}
	}
	c.bandwidth = set
	return errs
}

// impairSet is what setImpairments last gave a network: its ports'
// impairments, and the network (one started again has none).
type impairSet struct {
	nw backend.Network
	ps string
}

// setImpairments gives each running network what its VMs' ports lose on
// purpose (backend.Impairer), the ports of running helpers whose
// attachments have an `impair`: a pass asked for, when they changed
// since the last (impairSet); a full pass, every network's, which takes
// off those removed while no controller ran and puts back what changed
// behind the controller's back.
func (c *Controller) setImpairments(desired *spec.Desired, full bool) []error {
	byNet := map[string][]backend.PortImpairment{}
	for _, a := range desired.Attachments {
		h := c.helpers[a.Key()]
		imp, _ := c.impairOf(a)
		if imp == nil || h == nil || h.state != ctlapi.StateRunning || h.rec.Tap == "" {
			continue
		}
		byNet[a.Network] = append(byNet[a.Network], backend.PortImpairment{Port: h.rec.Tap, Impairment: *imp})
	}
	var errs []error
	set := map[string]impairSet{}
	for _, n := range desired.Networks {
		nw := c.nets[n.ID]
		im, ok := nw.(backend.Impairer)
		if !ok || !n.Routed() { // (a bridged network takes none)
			continue
		}
		ps := byNet[n.ID]
		want := impairSet{nw: nw, ps: fmt.Sprint(ps)}
		prev, had := c.impairs[n.ID]
		switch {
		case !full && had && prev == want:
			set[n.ID] = want
			continue
		case !full && !had && len(ps) == 0:
			continue
		}
		if err := im.SetImpairments(ps); err != nil {
			errs = append(errs, err)
			set[n.ID] = impairSet{} // unknown: tried again next pass
			continue
		}
		if len(ps) > 0 {
			set[n.ID] = want
		}
	}
	c.impairs = set
	return errs
}

// shapingSet is what setShapings last wrote for a helper: its process
// and the shaping.
type shapingSet struct {
	pid int
	s   helperproto.Shapings
}

// setShapings keeps the shaping file of each running helper whose
// attachment is shaped (api.Impairment.Shaped: a delay, jitter,
// duplication or reordering, which its relay does) what its impairment
// says, and signals the helper when it wrote it anew
// (helperproto.ShapingSignal; a helper that does not listen yet reads it
// once it does). A pass asked for touches only the attachments whose
// shaping or helper changed since the last; a full pass looks at every
// running helper's file, and puts back what changed behind its back: an
// unshaped helper's file only if the watch of the helpers' directory saw
// it written since the last full pass found it right (or cannot tell):
// reading 10,000 unshaped helpers' files every resync was an idle
// controller's largest step.
func (c *Controller) setShapings(desired *spec.Desired, full bool) []error {
	shaper, ok := c.be.(backend.LinkShaper)
	if !ok { // (vmnet-helper shapes nothing, and dies of the signal)
		return nil
	}
	var errs []error
	set := map[string]shapingSet{}
	unshaped := map[string]int{}
	if full {
		c.shapingWatch.Drain()
		defer c.shapingWatch.Take()
	}
	defer func() { c.unshaped = unshaped }()
	for _, a := range desired.Attachments {
		h := c.helpers[a.Key()]
		if h == nil || h.state != ctlapi.StateRunning || h.rec.Proc.PID <= 0 || isClosed(h.exited) || !shaper.Shapes(a.Attachment) {
			continue
		}
		imp, _ := c.impairOf(a)
		want := shapingSet{pid: h.rec.Proc.PID, s: shapingsOf(imp)}
		prev, had := c.shapings[a.Key()]
		path := c.sd.HelperShapingFile(a.Key())
		switch {
		case !full && had && prev == want:
			set[a.Key()] = want
			continue
		case !full && !had && want.s == (helperproto.Shapings{}):
			unshaped[a.Key()] = c.unshaped[a.Key()]
			continue
		case !had && want.s == (helperproto.Shapings{}) && c.unshaped[a.Key()] == want.pid &&
			c.shapingWatch.Tells() && !c.shapingWatch.Moved(path):
			unshaped[a.Key()] = want.pid
			continue
		}
		changed, err := helperproto.WriteShapings(path, want.s)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: the link's shaping: %w", a.Key(), err))
			continue
		}
		// Signalled when the file changed, or when it is not known that
		// this helper has read it (a signal that failed is tried again:
		// the entry is recorded only once the helper was told), through a
		// pidfd, to the helper only: not to a process that got its pid
		// since it went.
		if (changed || !had && want.s != helperproto.Shapings{}) && !h.rec.Proc.Signal(helperproto.ShapingSignal) {
			continue
		}
		if want.s != (helperproto.Shapings{}) {
			set[a.Key()] = want
		} else {
			unshaped[a.Key()] = want.pid
		}
	}
	c.shapings = set
	return errs
}

// shapingsOf is the shaping a helper does for an impairment.
func shapingsOf(i *api.Impairment) helperproto.Shapings {
	if !i.Shaped() {
		return helperproto.Shapings{}
	}
	return helperproto.Shapings{
		ToVM:   helperproto.Shaping{Delay: i.DelayToVM, Jitter: i.JitterToVM, Duplicate: i.DuplicateToVM, Reorder: i.ReorderToVM},
		FromVM: helperproto.Shaping{Delay: i.DelayFromVM, Jitter: i.JitterFromVM, Duplicate: i.DuplicateFromVM, Reorder: i.ReorderFromVM},
	}
}

// partitionsSet is what setPartitions last gave a network: the pairs, and
// the network (one started again has none).
type partitionsSet struct {
	nw    backend.Network
	pairs string
}

// setPartitions gives each running network the pairs of its VMs that its
// partitions part (backend.Partitioner): a pass asked for, when they
// changed since the last (partitionsSet); a full pass, every network's,
// which takes off the pairs of partitions removed while no controller
// ran and puts back what changed behind the controller's back.
func (c *Controller) setPartitions(desired *spec.Desired, full bool) []error {
	var errs []error
	set := map[string]partitionsSet{}
	for _, n := range desired.Networks {
		nw := c.nets[n.ID]
		p, ok := nw.(backend.Partitioner)
		if !ok || !n.Routed() { // (a bridged network takes none)
			continue
		}
		pairs := partitionPairs(n, desired)
		want := partitionsSet{nw: nw, pairs: fmt.Sprint(pairs)}
		prev, had := c.partitions[n.ID]
		switch {
		case !full && had && prev == want:
			set[n.ID] = want
			continue
		case !full && !had && len(pairs) == 0:
			continue
		}
		if err := p.SetPartitions(pairs); err != nil {
			errs = append(errs, err)
			set[n.ID] = partitionsSet{} // unknown: tried again next pass
			continue
		}
		if len(pairs) > 0 {
			set[n.ID] = want
		}
	}
	c.partitions = set
	return errs
}

// partitionPairs are the pairs (source MAC, destination MAC) of the VMs
// on n that n's partitions put in two groups, both ways.
func partitionPairs(n *api.Network, d *spec.Desired) [][2]net.HardwareAddr {
	if len(n.Partitions) == 0 {
		return nil
	}
	type member struct {
		group int
		mac   net.HardwareAddr
	}
	var ms []member
	for _, a := range d.Attachments {
		if g := n.Partitions.Group(a.VM); a.Network == n.ID && g >= 0 {
			ms = append(ms, member{g, mustMAC(a.MAC)})
		}
	}
	var pairs [][2]net.HardwareAddr
	for _, x := range ms {
		for _, y := range ms {
			if x.group != y.group {
				pairs = append(pairs, [2]net.HardwareAddr{x.mac, y.mac})
			}
		}
	}
	return pairs
}
