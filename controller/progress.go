package controller

import (
	"cmp"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/vmnetctl/vmnetctl/ctlapi"
)

// slowShown bounds Progress.Slow.
const slowShown = 5

// The steps of a pass, by the label of their time in the metrics
// (vmnetctl_reconcile_phase_seconds_total), with what `up` and /healthz
// show of them.
var phases = map[string]string{
	"desired":    "reading the desired state",
	"stop":       "stopping helpers",
	"repair":     "repairing networks",
	"networks":   "networks",
	"names":      "names and reservations",
	"partitions": "partitions",
	"forwards":   "port forwards",
	"claims":     "claiming the VMs' MACs",
	"start":      "starting helpers",
	"bandwidth":  "bandwidth limits",
	"ports":      "checking ports",
	"commit":     "recording the state",
}

// progress tracks the reconcile loop (its phases, and the time each took
// in all) and the helpers a pass starts.
type progress struct {
	mu       sync.Mutex
	p        ctlapi.Progress
	starting map[string]time.Time
	// phase is the step that runs (a key of phases), since phaseAt;
	// spent the time every step took, all passes together.
	phase   string
	phaseAt time.Time
	spent   map[string]time.Duration
	clock   func() time.Time // time.Now if nil (tests set it)
}

// enter records that step id (a key of phases) of the pass begins now;
// "" when the pass ends.
func (t *progress) enter(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	if t.clock != nil {
		now = t.clock()
	}
	if t.phase != "" {
		if t.spent == nil {
			t.spent = map[string]time.Duration{}
		}
		t.spent[t.phase] += now.Sub(t.phaseAt)
	}
	t.phase, t.phaseAt = id, now
	switch {
	case id == "":
		t.p, t.starting = ctlapi.Progress{}, nil
		return
	case t.p.Phase == "":
		t.p.Since = now
	}
	t.p.Phase, t.p.Moved = cmp.Or(phases[id], id), now
}

// spentIn is the time the passes spent in each step, all together.
func (t *progress) spentIn() map[string]time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps.Clone(t.spent)
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
func (t *progress) snapshot() ctlapi.Progress {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.p
	for key, since := range t.starting {
		p.Slow = append(p.Slow, ctlapi.SlowStart{Attachment: key, Since: since})
	}
	slices.SortFunc(p.Slow, func(a, b ctlapi.SlowStart) int {
		return cmp.Or(a.Since.Compare(b.Since), cmp.Compare(a.Attachment, b.Attachment))
	})
	p.Slow = p.Slow[:min(len(p.Slow), slowShown)]
	return p
}
