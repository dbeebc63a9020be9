package controller

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/spec"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// `up` checks a project against every other project of the state dir
// before it records it: VMs, MACs and addresses may not collide across
// projects. Parsing a fleet's files for that costs what the fleet costs,
// on every `up` of one VM; the controller has them parsed already (its
// ParseCache), so `up` asks it (POST /v1/check) when one runs with the
// networks.yaml of this `up`, and parses them itself otherwise.

// maxCheckBody bounds a check request: a project's files (at most
// api.MaxFileSize each, base64 in JSON) and little else.
const maxCheckBody = 8 * api.MaxFileSize

// serveCheck answers POST /v1/check (daemon side).
func (c *Controller) serveCheck(w http.ResponseWriter, r *http.Request) {
	var req ctlapi.CheckRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxCheckBody)).Decode(&req); err != nil {
		http.Error(w, "check: "+err.Error(), http.StatusBadRequest)
		return
	}
	check, err := c.checkProject(&req.Project)
	if err != nil {
		http.Error(w, "check: "+err.Error(), http.StatusInternalServerError)
		return
	}
	writeJSON(w, check.CheckResponse)
}

// projectCheck is what checkProject found: its verdict, and the project
// as parsed and resolved with the others (the desired state nil when it
// did not resolve), for what is checked after it.
type projectCheck struct {
	ctlapi.CheckResponse
	parsed  spec.ParsedProject
	desired *spec.Desired
}

// checkProject resolves p with the state dir's other projects, as
// recorded, against the networks of record (daemon side).
func (c *Controller) checkProject(p *statedir.Project) (*projectCheck, error) {
	projects, err := c.projects.Projects(c.sd)
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
	nets, err := c.loadNetworks(snap)
	if err != nil {
		return nil, err
	}
	var others []*statedir.Project
	for _, q := range projects {
		if q.Name != p.Name {
			others = append(others, q)
		}
	}
	c.parseMu.Lock()
	parsed, odiags := c.resolver.Peek(others)
	c.parseMu.Unlock()
	// Its own warnings `up` has reported; an error here that `up` did not
	// find (the files read otherwise here) is the controller's to say.
	pp, pdiags := spec.ParseProject(p)
	d, rdiags := spec.Resolve(nets, append([]spec.ParsedProject{pp}, parsed...), nil)
	return &projectCheck{CheckResponse: ctlapi.CheckResponse{Resolve: append(pdiags.Errors(), rdiags...), Others: odiags}, parsed: pp, desired: d}, nil
}
