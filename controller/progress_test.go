package controller

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/ops"
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
	c.progress.phase("starting helpers")
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
	if line := ops.ProgressLine(p, p.Since.Add(10*time.Second)); !strings.Contains(line, "1 of 3 attachments ready, 1 failed; slowest b/0") {
		t.Errorf("line %q", line)
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
	c.progress.phase("")
	if code, _ := health(); code != http.StatusOK {
		t.Errorf("after the pass: /healthz %d", code)
	}
}
