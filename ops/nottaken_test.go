package ops

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// TestNotTaken: `up` and `down` do a change of the projects' API
// themselves when the controller did nothing with it (no controller on
// the socket, an older one, one that refuses it as a whole) or no answer
// came (a controller killed as it took the connection), never when the
// controller refused the request itself or the command gave up waiting.
func TestNotTaken(t *testing.T) {
	sd := statedir.Dir{Path: filepath.Join(t.TempDir(), "state")}
	if err := sd.Init(); err != nil {
		t.Fatal(err)
	}
	req := &ctlapi.ApplyRequest{Project: statedir.Project{Name: "web"}}
	// No controller: the dial fails.
	if _, err := NewClient(sd).ApplyProject(context.Background(), req); !errors.Is(err, errNotApplied) {
		t.Errorf("no controller: %v, want errNotApplied", err)
	}
	for _, tc := range []struct {
		code  int
		taken bool
	}{
		{http.StatusNotFound, false},
		{http.StatusMethodNotAllowed, false},
		{http.StatusConflict, false},
		{http.StatusRequestEntityTooLarge, false},
		{http.StatusServiceUnavailable, false},
		{http.StatusInternalServerError, true},
		{http.StatusBadRequest, true},
		{http.StatusForbidden, true},
	} {
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "no", tc.code)
		}))
		ln := listenUnix(t, sd.APISocket())
		srv.Listener = ln
		srv.Start()
		cl := NewClient(sd)
		_, aerr := cl.ApplyProject(context.Background(), req)
		_, rerr := cl.RemoveProject(context.Background(), "web")
		srv.Close()
		for _, err := range []error{aerr, rerr} {
			if err == nil || errors.Is(err, errNotApplied) == tc.taken {
				t.Errorf("HTTP %d: %v; want errNotApplied: %v", tc.code, err, !tc.taken)
			}
		}
	}
	// A controller that dies with the connection: no answer.
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
	}))
	srv.Listener = listenUnix(t, sd.APISocket())
	srv.Start()
	if _, err := NewClient(sd).ApplyProject(context.Background(), req); !errors.Is(err, errNotApplied) {
		t.Errorf("a controller gone without an answer: %v, want errNotApplied", err)
	}
	srv.Close()
	// The command gave up waiting: its own error.
	srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }))
	srv.Listener = listenUnix(t, sd.APISocket())
	srv.Start()
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := NewClient(sd).ApplyProject(ctx, req); err == nil || errors.Is(err, errNotApplied) {
		t.Errorf("a command that gave up: %v, want its own error", err)
	}
}

// listenUnix listens on path, a unix socket, for the test.
func listenUnix(t *testing.T, path string) net.Listener {
	t.Helper()
	os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	return ln
}
