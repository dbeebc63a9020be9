package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// `up` checks a project against every other project of the state dir
// before it records it: VMs, MACs and addresses may not collide across
// projects. Parsing a fleet's files for that costs what the fleet costs,
// on every `up` of one VM; the controller has them parsed already (its
// parseCache), so `up` asks it (POST /v1/check) when one runs with the
// networks.yaml of this `up`, and parses them itself otherwise.

// CheckRequest is a project that `up` would record.
type CheckRequest struct {
	Project statedir.Project `json:"project"`
}

// CheckResponse is what the controller found.
type CheckResponse struct {
	// Resolve is the diagnostics of resolving the project with the
	// others, warnings included.
	Resolve api.Diagnostics `json:"resolve,omitempty"`
	// Others is the diagnostics of parsing the other projects' files.
	Others api.Diagnostics `json:"others,omitempty"`
}

// maxCheckBody bounds a check request: a project's files (at most
// api.MaxFileSize each, base64 in JSON) and little else.
const maxCheckBody = 8 * api.MaxFileSize

// errNoCheck is Check's answer when no controller can check: the caller
// checks by itself.
var errNoCheck = errors.New("no controller to check with")

// serveCheck answers POST /v1/check (daemon side).
func (c *Controller) serveCheck(w http.ResponseWriter, r *http.Request) {
	var req CheckRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxCheckBody)).Decode(&req); err != nil {
		http.Error(w, "check: "+err.Error(), http.StatusBadRequest)
		return
	}
	resp, err := c.checkProject(&req.Project)
	if err != nil {
		http.Error(w, "check: "+err.Error(), http.StatusInternalServerError)
		return
	}
	writeJSON(w, resp)
}

// checkProject resolves p with the state dir's other projects, as
// recorded, against the networks of record (daemon side).
func (c *Controller) checkProject(p *statedir.Project) (*CheckResponse, error) {
	projects, err := c.sd.Projects()
	if err != nil {
		return nil, err
	}
	snap, err := c.sd.Networks()
	if err != nil {
		return nil, err
	}
	if snap == nil {
		return nil, errors.New("no networks.yaml of record")
	}
	nets, diags := api.LoadNetworks(snap.Source, snap.Data)
	if err := diags.Err(); err != nil {
		return nil, err
	}
	var others []*statedir.Project
	for _, q := range projects {
		if q.Name != p.Name {
			others = append(others, q)
		}
	}
	c.parseMu.Lock()
	parsed, odiags := c.parsed.peek(others)
	c.parseMu.Unlock()
	// Its own warnings `up` has reported; an error here that `up` did not
	// find (the files read otherwise here) is the controller's to say.
	pp, pdiags := parseProject(p)
	_, rdiags := desiredOf(nets, append([]parsedProject{pp}, parsed...), nil)
	return &CheckResponse{Resolve: append(pdiags.Errors(), rdiags...), Others: odiags}, nil
}

// Check asks the controller to check project p (CLI side); an error
// wrapping errNoCheck if none answers or it cannot.
func (cl *Client) Check(ctx context.Context, p *statedir.Project) (*CheckResponse, error) {
	body, err := json.Marshal(CheckRequest{Project: *p})
	if err != nil {
		return nil, err
	}
	// The check only saves work: a controller that does not answer in
	// checkWait (stopped, wedged, or slow on a busy machine), that
	// predates it (404) or that cannot (a request too large, its networks
	// gone as it exits idle) leaves it to the command, which checks as it
	// always did, at its own pace.
	ctx, cancel := context.WithTimeout(ctx, checkWait)
	defer cancel()
	resp := &CheckResponse{}
	if _, err := cl.call(ctx, http.MethodPost, "/v1/check", body, resp); err != nil {
		return nil, fmt.Errorf("%w: %v", errNoCheck, err)
	}
	return resp, nil
}

// checkWait bounds the wait for the controller's check; past it the
// command checks by itself (slower, never wrong).
const checkWait = 5 * time.Second

// checkedDesired is `up`'s check of l's project beside the state dir's
// others (existing): every problem of every file at once, its warnings
// written to env. When ask, the controller checks if one runs; ask only
// when the controller runs with the networks.yaml of l. The Desired
// returned has l's project's attachments (to check their forwards), and
// those of the others only when they were parsed here.
func (l *loaded) checkedDesired(ctx context.Context, env Env, existing []*statedir.Project, ask bool) (*Desired, error) {
	if !ask {
		return l.desiredWith(env, existing, nil)
	}
	resp, err := NewClient(env.StateDir).Check(ctx, l.project.Project)
	if err != nil {
		return l.desiredWith(env, existing, nil)
	}
	env.warn(resp.Resolve)
	if err := append(resp.Others, resp.Resolve...).Err(); err != nil {
		return nil, err
	}
	alone := parsedProject{Project: l.project.Project}
	for _, f := range l.project.files {
		alone.files = append(alone.files, f.Clone())
	}
	d, diags := desiredOf(l.nets, []parsedProject{alone}, nil)
	if err := diags.Err(); err != nil {
		return nil, err
	}
	return d, nil
}
