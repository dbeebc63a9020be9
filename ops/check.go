package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/spec"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// errNoCheck is Check's answer when no controller can check: the caller
// checks by itself.
var errNoCheck = errors.New("no controller to check with")

// Check asks the controller to check project p (CLI side); an error
// wrapping errNoCheck if none answers or it cannot.
func (cl *Client) Check(ctx context.Context, p *statedir.Project) (*ctlapi.CheckResponse, error) {
	body, err := json.Marshal(ctlapi.CheckRequest{Project: *p})
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
	resp := &ctlapi.CheckResponse{}
	if _, err := cl.call(ctx, http.MethodPost, "/v1/check", body, resp); err != nil {
		return nil, fmt.Errorf("%w: %v", errNoCheck, err)
	}
	return resp, nil
}

// checkWait bounds the wait for the controller's check; past it the
// command checks by itself (slower, never wrong).
const checkWait = 5 * time.Second

// CheckedDesired is `up`'s check of l's project beside the state dir's
// others (existing, called only if they are to be parsed here): every
// problem of every file at once, its warnings written to env. When ask,
// the controller checks if one runs; ask only when the controller runs
// with the networks.yaml of l. The Desired
// returned has l's project's attachments (to check their forwards), and
// those of the others only when they were parsed here.
func (l *Loaded) CheckedDesired(ctx context.Context, env Env, existing func() ([]*statedir.Project, error), ask bool) (*spec.Desired, error) {
	here := func() (*spec.Desired, error) {
		existing, err := existing()
		if err != nil {
			return nil, err
		}
		return l.DesiredWith(env, existing, nil)
	}
	if !ask {
		return here()
	}
	resp, err := NewClient(env.StateDir).Check(ctx, l.Project.Project)
	if err != nil {
		return here()
	}
	env.warn(resp.Resolve)
	if err := append(resp.Others, resp.Resolve...).Err(); err != nil {
		return nil, err
	}
	alone := spec.ParsedProject{Project: l.Project.Project}
	for _, f := range l.Project.Files {
		alone.Files = append(alone.Files, f.Clone())
	}
	d, diags := spec.Resolve(l.Networks, []spec.ParsedProject{alone}, nil)
	if err := diags.Err(); err != nil {
		return nil, err
	}
	return d, nil
}
