package ctlapi

import (
	"time"

	"github.com/vmnetctl/vmnetctl/api"
)

// Progress is what the controller's reconcile loop is doing, for `up`'s
// progress line and /healthz: read without the controller's lock, so it
// answers while a long pass holds it.
type Progress struct {
	// Phase is the step of the pass that runs ("stopping helpers",
	// "networks", "starting helpers", ...); empty when no pass runs.
	Phase string `json:"phase,omitempty"`
	// Since is when the pass began, and Moved when it last got anywhere
	// (a new step, a helper ready or failed).
	Since time.Time `json:"since,omitzero"`
	Moved time.Time `json:"moved,omitzero"`
	// Total is the helpers this pass starts; Ready and Failed how many of
	// them are.
	Total  int `json:"total"`
	Ready  int `json:"ready"`
	Failed int `json:"failed"`
	// Slow are the helpers starting the longest, at most slowShown of
	// them, slowest first.
	Slow []SlowStart `json:"slow,omitempty"`
}

// SlowStart is a helper that is taking its time.
type SlowStart struct {
	Attachment string    `json:"attachment"`
	Since      time.Time `json:"since"`
}

// StuckAfter is how long a pass may go without getting anywhere before
// /healthz says the loop is stuck: far beyond any one step on a busy
// machine (a helper that makes no progress fails in StallTimeout).
const StuckAfter = 5 * time.Minute

// stuck says, for /healthz, whether the pass in progress has not moved
// for StuckAfter, and in which phase.
func (p Progress) Stuck(now time.Time) bool {
	return p.Phase != "" && now.Sub(p.Moved) > StuckAfter
}

// ReconcileResponse answers POST /v1/reconcile.
type ReconcileResponse struct {
	Error  string  `json:"error,omitempty"`
	Status *Status `json:"status"`
	// Stays is set by a controller that keeps running with no project
	// (a service); one run with --exit-when-idle exits then.
	Stays bool `json:"stays,omitempty"`
}

// ImpairRequest is POST /v1/impair: what `vmnetctl impair` sets on a VM's
// attachment (to Network, for a VM on several) in place of its VM file's
// impair: Impair, or none at all when nil; with Clear, the VM file's
// again. The answer is a ReconcileResponse, after the pass that applied
// it, with the status of the VM's project.
type ImpairRequest struct {
	VM      string          `json:"vm"`
	Network string          `json:"network,omitempty"`
	Impair  *api.Impairment `json:"impair,omitempty"`
	Clear   bool            `json:"clear,omitempty"`
}

// ImpairSetBy is AttachmentStatus.ImpairSetBy for `vmnetctl impair`.
const ImpairSetBy = "vmnetctl impair"
