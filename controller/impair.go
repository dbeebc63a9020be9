package controller

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/spec"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// serveImpair answers POST /v1/impair (ctlapi.ImpairRequest): it records
// what `vmnetctl impair` sets on a VM's attachment in place of its VM
// file's impair (statedir.ImpairOverride), for root or the VM's owner,
// and answers once a pass applied it.
func (c *Controller) serveImpair(w http.ResponseWriter, r *http.Request) {
	var req ctlapi.ImpairRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&req); err != nil {
		http.Error(w, "impair: "+err.Error(), http.StatusBadRequest)
		return
	}
	if req.Impair != nil {
		if err := req.Impair.Check(); err != nil {
			http.Error(w, "impair: "+err.Error(), http.StatusBadRequest)
			return
		}
	}
	c.mu.Lock()
	a, owner, err := c.findAttachmentLocked(req.VM, req.Network)
	if err == nil {
		if n := c.applied.Network(a.Network); n != nil && !n.Routed() {
			err = fmt.Errorf("network %q is %s: impairment is for shared and host networks", a.Network, n.Mode)
		} else if req.Impair.Shaped() && a.Attach == api.AttachTAP {
			err = fmt.Errorf("%s is attached by tap: delay, jitter, duplicate and reorder are done by the helper, which its frames do not go through", a.Key())
		}
	}
	if err != nil {
		c.mu.Unlock()
		http.Error(w, "impair: "+err.Error(), http.StatusNotFound)
		return
	}
	if uid, ok := r.Context().Value(peerUIDKey{}).(int); !ok || uid != 0 && uid != os.Geteuid() && uid != owner {
		c.mu.Unlock()
		http.Error(w, fmt.Sprintf("impair: only root or the VM's owner (uid %d) may impair %s", owner, a.Key()), http.StatusForbidden)
		return
	}
	overrides := slices.DeleteFunc(slices.Clone(c.impairOverridesLocked()), func(o statedir.ImpairOverride) bool {
		return o.VM == a.VM && o.Network == a.Network
	})
	if !req.Clear {
		overrides = append(overrides, statedir.ImpairOverride{VM: a.VM, Network: a.Network, Impair: req.Impair, Set: time.Now().UTC()})
	}
	err = c.sd.SaveImpairOverrides(overrides)
	if err == nil {
		c.overrides = overrides
	}
	project := a.Project
	c.mu.Unlock()
	if err != nil {
		http.Error(w, "impair: "+err.Error(), http.StatusInternalServerError)
		return
	}
	resp := ctlapi.ReconcileResponse{}
	if err := c.waitReconcile(r.Context()); err != nil {
		resp.Error = err.Error()
	}
	resp.Status = c.statusOf(project)
	writeJSON(w, resp)
}

// impairOverridesLocked is what `vmnetctl impair` recorded, read from the
// state dir the first time. Call with c.mu held.
func (c *Controller) impairOverridesLocked() []statedir.ImpairOverride {
	if !c.overridesRead {
		overrides, err := c.sd.ImpairOverrides()
		if err != nil {
			c.log.Warn("the overrides of `vmnetctl impair` are unreadable; the VM files' impairments apply", "err", err)
		}
		c.overrides, c.overridesRead = overrides, true
	}
	return c.overrides
}

// impairOf is what a's link loses: what `vmnetctl impair` set on it if it
// did (set true), else its VM file's. Call with c.mu held.
func (c *Controller) impairOf(a *spec.Attachment) (imp *api.Impairment, set bool) {
	for _, o := range c.impairOverridesLocked() {
		if o.VM == a.VM && o.Network == a.Network {
			return o.Impair, true
		}
	}
	return a.Impair, false
}
