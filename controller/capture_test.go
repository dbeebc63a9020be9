package controller

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/backend"
	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/spec"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// capturer is a backend that captures a fixed stream, and records the
// port and options it was asked for.
type capturer struct {
	backend.Backend
	port string
	o    backend.CaptureOptions
}

func (c *capturer) Name() string { return "test" }

func (c *capturer) Capture(_ context.Context, port string, o backend.CaptureOptions, w io.Writer) (backend.CaptureStats, error) {
	c.port, c.o = port, o
	if o.Bound != nil {
		o.Bound()
	}
	_, err := io.WriteString(w, "pcapng")
	return backend.CaptureStats{Frames: 6, Dropped: 1}, err
}

// TestCaptureOnlyOwner: GET /v1/capture streams the VM's port's frames
// to root and to the VM's owner, with what it captured in the trailer;
// another user is refused, and so is a VM that is not up, a count that
// is no number, and a capture beyond maxCaptures at once.
func TestCaptureOnlyOwner(t *testing.T) {
	be := &capturer{}
	a := &spec.Attachment{Attachment: &api.Attachment{VM: "web", Network: "shared"}, Project: "p"}
	c := &Controller{be: be, helpers: map[string]*helperProc{a.Key(): {state: ctlapi.StateRunning, rec: statedir.HelperRecord{Tap: "vmt-web"}}},
		applied: &spec.Desired{Attachments: []*spec.Attachment{a}}, appliedP: []*statedir.Project{{Name: "p", UID: 1000}}}
	h := c.handler()
	get := func(uid int, query string) *httptest.ResponseRecorder {
		t.Helper()
		w := httptest.NewRecorder()
		ctx := context.WithValue(context.Background(), peerUIDKey{}, uid)
		h.ServeHTTP(w, httptest.NewRequestWithContext(ctx, http.MethodGet, "/v1/capture?"+query, nil))
		return w
	}
	for _, uid := range []int{0, 1000} {
		w := get(uid, "vm=web&count=6")
		if w.Code != http.StatusOK || w.Body.String() != "pcapng" || w.Result().Trailer.Get(ctlapi.CaptureTrailer) != "frames=6 dropped=1" {
			t.Errorf("uid %d: HTTP %d %q, trailer %q", uid, w.Code, w.Body.String(), w.Result().Trailer.Get(ctlapi.CaptureTrailer))
		}
		if be.port != "vmt-web" || be.o.Count != 6 || be.o.Name != "web/0 on shared" {
			t.Errorf("uid %d: captured %s with %+v", uid, be.port, be.o)
		}
	}
	c.captures.Store(maxCaptures) // as many as may run, running
	if w := get(0, "vm=web"); w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), "captures run already") {
		t.Errorf("a capture beyond %d: HTTP %d %q, want 503", maxCaptures, w.Code, w.Body.String())
	}
	c.captures.Store(0)
	for _, tc := range []struct {
		uid   int
		query string
		code  int
		want  string
	}{
		{2000, "vm=web", http.StatusForbidden, "only root or the VM's owner (uid 1000)"},
		{0, "vm=nope", http.StatusNotFound, `VM "nope" is not up; VMs that are up: [web]`},
		{0, "vm=web&network=other", http.StatusNotFound, `has no attachment on network "other"`},
		{0, "vm=web&count=many", http.StatusBadRequest, `count "many" is not a number`},
	} {
		if w := get(tc.uid, tc.query); w.Code != tc.code || !strings.Contains(w.Body.String(), tc.want) {
			t.Errorf("uid %d, %s: HTTP %d %q, want %d with %q", tc.uid, tc.query, w.Code, w.Body.String(), tc.code, tc.want)
		}
	}
}
