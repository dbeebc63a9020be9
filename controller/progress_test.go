package controller

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/ctlapi"
)

// TestProgress: the tracker counts a pass's helpers and names the slowest;
// /healthz says ok while a pass moves or none runs, and 503 with the step
// once a pass has not moved for StuckAfter.
func TestProgress(t *testing.T) {
	c := &Controller{}
	health := func() (int, string) {
		rec := httptest.NewRecorder()
		c.healthz(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		return rec.Code, rec.Body.String()
	}
	if code, _ := health(); code != http.StatusOK {
		t.Errorf("idle: /healthz %d", code)
	}
	c.progress.enter("start")
	c.progress.begin(3)
	c.progress.start("a/0")
	c.progress.start("b/0")
	c.progress.done("a/0", nil)
	c.progress.start("c/0")
	c.progress.done("c/0", errors.New("failed"))
	p := c.progress.snapshot()
	if p.Total != 3 || p.Ready != 1 || p.Failed != 1 || len(p.Slow) != 1 || p.Slow[0].Attachment != "b/0" {
		t.Errorf("progress %+v: want 3 helpers, 1 ready, 1 failed, b/0 starting", p)
	}
	if code, _ := health(); code != http.StatusOK {
		t.Errorf("a pass that moves: /healthz %d", code)
	}
	c.progress.mu.Lock()
	c.progress.p.Moved = time.Now().Add(-ctlapi.StuckAfter - time.Second)
	c.progress.mu.Unlock()
	if code, body := health(); code != http.StatusServiceUnavailable || !strings.Contains(body, `"starting helpers"`) {
		t.Errorf("a pass stuck for %v: /healthz %d %q, want 503 naming the step", ctlapi.StuckAfter, code, body)
	}
	c.progress.enter("")
	if code, _ := health(); code != http.StatusOK {
		t.Errorf("after the pass: /healthz %d", code)
	}
}

// TestPhaseTimes: each step's time is counted to that step, across
// passes, and served as vmnetctl_reconcile_phase_seconds_total for every
// step (at 0 until it runs: rate() works from the first scrape).
func TestPhaseTimes(t *testing.T) {
	c := metricsController(t)
	now := time.Unix(1000, 0)
	c.progress.clock = func() time.Time { return now }
	pass := func(steps ...string) {
		for _, id := range steps {
			c.progress.enter(id)
			now = now.Add(time.Second)
		}
		c.progress.enter("")
	}
	pass("desired", "start")
	pass("desired", "claims", "commit")
	want := map[string]float64{"desired": 2, "start": 1, "claims": 1, "commit": 1, "stop": 0, "names": 0}
	mfs := gather(t, c)
	for phase, secs := range want {
		if got, ok := value(mfs, "vmnetctl_reconcile_phase_seconds_total", "phase="+phase); !ok || got != secs {
			t.Errorf("phase %s: %v s (served %v), want %v", phase, got, ok, secs)
		}
	}
}
