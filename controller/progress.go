package controller

import (
	"cmp"
	"slices"
	"sync"
	"time"
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

// slowShown bounds Progress.Slow.
const slowShown = 5

// progress tracks the reconcile loop (its phases) and the helpers a pass
// starts.
type progress struct {
	mu       sync.Mutex
	p        Progress
	starting map[string]time.Time
}

// phase records the step of the pass that begins now; "" when the pass
// ends.
func (t *progress) phase(name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	switch {
	case name == "":
		t.p, t.starting = Progress{}, nil
		return
	case t.p.Phase == "":
		t.p.Since = now
	}
	t.p.Phase, t.p.Moved = name, now
}

// begin counts the n helpers this pass starts.
func (t *progress) begin(n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.p.Total, t.p.Ready, t.p.Failed = n, 0, 0
	t.starting = map[string]time.Time{}
	t.p.Moved = time.Now()
}

// start records that attachment key's helper is being started.
func (t *progress) start(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.starting != nil {
		t.starting[key] = time.Now()
	}
}

// done records how attachment key's start ended.
func (t *progress) done(key string, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.starting, key)
	if err != nil {
		t.p.Failed++
	} else {
		t.p.Ready++
	}
	t.p.Moved = time.Now()
}

// snapshot is the progress now.
func (t *progress) snapshot() Progress {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.p
	for key, since := range t.starting {
		p.Slow = append(p.Slow, SlowStart{Attachment: key, Since: since})
	}
	slices.SortFunc(p.Slow, func(a, b SlowStart) int {
		return cmp.Or(a.Since.Compare(b.Since), cmp.Compare(a.Attachment, b.Attachment))
	})
	p.Slow = p.Slow[:min(len(p.Slow), slowShown)]
	return p
}

// stuckAfter is how long a pass may go without getting anywhere before
// /healthz says the loop is stuck: far beyond any one step on a busy
// machine (a helper that makes no progress fails in StallTimeout).
const stuckAfter = 5 * time.Minute

// stuck says, for /healthz, whether the pass in progress has not moved
// for stuckAfter, and in which phase.
func (p Progress) stuck(now time.Time) bool {
	return p.Phase != "" && now.Sub(p.Moved) > stuckAfter
}
