package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/spec"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// The projects' API (ctlapi.ProjectsPath): `up` and `down` of one project
// in one round trip, daemon side. Each holds the state dir's ops lock, as
// the commands do, from its check to the end of the pass that converged
// it: one up, down or run at a time per state dir, whoever runs it.

// errExiting refuses a change to a controller that is exiting: it found
// no project left, and will not converge one recorded now (the client
// records it the slow way, which starts a controller).
var errExiting = errors.New("the controller is exiting: no project was left")

// serveApply is PUT /v1/projects/{name}: the project checked with the
// others, recorded, converged.
func (c *Controller) serveApply(w http.ResponseWriter, r *http.Request) {
	var req ctlapi.ApplyRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxCheckBody)).Decode(&req); err != nil {
		code := http.StatusBadRequest
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			code = http.StatusRequestEntityTooLarge // (`up` checks such a project itself)
		}
		http.Error(w, "apply: "+err.Error(), code)
		return
	}
	if req.Project.Name != r.PathValue("name") {
		http.Error(w, fmt.Sprintf("apply: the project is named %q, the path %q", req.Project.Name, r.PathValue("name")), http.StatusBadRequest)
		return
	}
	if err := statedir.CheckProjectName(req.Project.Name); err != nil {
		http.Error(w, "apply: "+err.Error(), http.StatusBadRequest)
		return
	}
	// What `up` records: VM files, whole. Projects the controller keeps
	// for itself (a process's, a network's, a `run`'s) are not the API's
	// to write.
	switch p := &req.Project; {
	case len(p.Files) == 0:
		http.Error(w, "apply: no VM file in the project", http.StatusBadRequest)
		return
	case p.Holder != nil || p.External || len(p.Networks) > 0 || len(p.OnDemand) > 0 || len(p.OnlyVMs) > 0:
		http.Error(w, "apply: only a project of VM files is applied here", http.StatusBadRequest)
		return
	}
	done, err := c.changeProjects(r.Context())
	if err != nil {
		httpErrorOf(w, "apply", err)
		return
	}
	defer done()
	resp := ctlapi.ApplyResponse{}
	refuse := func(msg string) {
		resp.Refused = msg
		writeJSON(w, resp)
	}
	rec, err := c.sd.Networks()
	if err != nil {
		http.Error(w, "apply: "+err.Error(), http.StatusInternalServerError)
		return
	}
	if !rec.Same(req.Networks) {
		http.Error(w, "apply: not the networks.yaml of record: `vmnetctl up` changes networks", http.StatusConflict)
		return
	}
	same, err := c.sd.Project(req.Project.Name)
	if err != nil {
		http.Error(w, "apply: "+err.Error(), http.StatusInternalServerError)
		return
	}
	if err := statedir.NameTaken(&req.Project, same, req.NameGiven); err != nil {
		refuse(err.Error())
		return
	}
	check, err := c.checkProject(&req.Project)
	if err != nil {
		http.Error(w, "apply: "+err.Error(), http.StatusInternalServerError)
		return
	}
	resp.CheckResponse = check.CheckResponse
	if append(check.Others, check.Resolve...).HasErrors() {
		writeJSON(w, resp)
		return
	}
	if err := c.checkOnHost(check); err != nil {
		refuse(err.Error())
		return
	}
	if err := c.sd.SaveProjectAndNetworks(*rec, &req.Project); err != nil {
		http.Error(w, "apply: "+err.Error(), http.StatusInternalServerError)
		return
	}
	resp.Recorded = true
	resp.ReconcileResponse = c.converge(r.Context(), req.Project.Name)
	writeJSON(w, resp)
}

// checkOnHost refuses, as `up` does, what the host would not allow a
// project that checked clean: a helper's socket path too long to bind, a
// port forward whose host port a program of the host listens on
// (spec.CheckForwardPorts).
func (c *Controller) checkOnHost(check *projectCheck) error {
	if err := c.sd.CheckSocketPaths(check.parsed.Files); err != nil {
		return err
	}
	return spec.CheckForwardPorts(check.desired, check.parsed.Name)
}

// serveRemove is DELETE /v1/projects/{name}: the project removed, its
// helpers stopped. Removing what is not there is fine.
func (c *Controller) serveRemove(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := statedir.CheckProjectName(name); err != nil {
		http.Error(w, "remove: "+err.Error(), http.StatusBadRequest)
		return
	}
	done, err := c.changeProjects(r.Context())
	if err != nil {
		httpErrorOf(w, "remove", err)
		return
	}
	defer done()
	if _, err := c.sd.DeleteProject(name); err != nil {
		http.Error(w, "remove: "+err.Error(), http.StatusInternalServerError)
		return
	}
	writeJSON(w, c.converge(r.Context(), name))
}

// converge has a pass run that started after the call, and answers with
// project's status (as POST /v1/reconcile?project= does).
func (c *Controller) converge(ctx context.Context, project string) ctlapi.ReconcileResponse {
	resp := ctlapi.ReconcileResponse{}
	c.retryNow(project)
	if err := c.waitReconcile(ctx); err != nil {
		resp.Error = err.Error()
	}
	c.mu.Lock()
	if c.lastErr != nil && resp.Error == "" {
		resp.Error = c.lastErr.Error()
	}
	c.mu.Unlock()
	resp.Status = c.statusOf(project)
	resp.Stays = !c.opts.ExitWhenIdle
	return resp
}

// changeProjects lets one request at a time change the projects, under
// the state dir's ops lock (which `up`, `down` and `run` take), and keeps
// an exiting controller from taking a change: a change counts (the loop
// does not exit while one is under way: exitIfIdle) only once it holds
// the lock, so that one waiting for a `down` that waits for the
// controller to exit does not keep it. Call done when the change's pass
// has answered.
func (c *Controller) changeProjects(ctx context.Context) (done func(), err error) {
	select {
	case c.changing <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	l, err := c.lockOps(ctx)
	if err != nil {
		<-c.changing
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.exiting {
		l.Unlock()
		<-c.changing
		return nil, errExiting
	}
	c.changes++
	return func() {
		c.mu.Lock()
		c.changes--
		if c.changes == 0 && c.idleDeferred {
			// The loop stayed for this change after a pass that found
			// no project: it looks again.
			c.idleDeferred = false
			c.kick()
		}
		c.mu.Unlock()
		l.Unlock()
		<-c.changing
	}, nil
}

// lockOps takes the state dir's ops lock, or gives up when ctx ends. Its
// flock(2) cannot be interrupted: one goroutine waits for it, and lets it
// go if the client left meanwhile.
func (c *Controller) lockOps(ctx context.Context) (*statedir.Lock, error) {
	type locked struct {
		l   *statedir.Lock
		err error
	}
	got := make(chan locked, 1)
	go func() {
		l, err := c.sd.LockOps()
		got <- locked{l, err}
	}()
	select {
	case r := <-got:
		return r.l, r.err
	case <-ctx.Done():
		go func() {
			if r := <-got; r.l != nil {
				r.l.Unlock()
			}
		}()
		return nil, ctx.Err()
	}
}

// exitIfIdle tells the loop whether to exit after a pass that found no
// project (with ExitWhenIdle): not while a change of the projects' API is
// under way (its project may have been recorded after the pass read
// them); once it says yes, such changes are refused (errExiting).
func (c *Controller) exitIfIdle() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.changes > 0 {
		c.idleDeferred = true
		return false
	}
	c.exiting = true
	return true
}

// httpErrorOf answers a change that could not begin: 503 from an exiting
// controller (the client then records it the slow way), else 500.
func httpErrorOf(w http.ResponseWriter, what string, err error) {
	code := http.StatusInternalServerError
	if errors.Is(err, errExiting) {
		code = http.StatusServiceUnavailable
	}
	http.Error(w, what+": "+err.Error(), code)
}
