package controller

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/vmnetctl/vmnetctl/ctlapi"
)

// slowShown bounds Progress.Slow.
const slowShown = 5

// progress tracks the reconcile loop (its phases) and the helpers a pass
// starts.
type progress struct {
	mu       sync.Mutex
	p        ctlapi.Progress
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
		t.p, t.starting = ctlapi.Progress{}, nil
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
