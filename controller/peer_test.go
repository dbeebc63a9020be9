package controller

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/ctlapi"
)

// TestReconcileOnlyRoot: the API's reconcile, check and changes of the
// projects, which change state or read every project, are refused to a
// client whose uid is neither root nor the controller's own
// (a member of the group networks.yaml lets read status), and to one whose
// uid is unknown; peerUID reads a unix socket client's uid from the kernel.
func TestReconcileOnlyRoot(t *testing.T) {
	h := (&Controller{}).handler()
	for _, ctx := range []context.Context{
		context.Background(),
		context.WithValue(context.Background(), peerUIDKey{}, os.Geteuid()+12345),
	} {
		for _, req := range [][2]string{
			{http.MethodPost, "/v1/reconcile"},
			{http.MethodPost, "/v1/check"},
			{http.MethodPut, ctlapi.ProjectsPath + "web"},
			{http.MethodDelete, ctlapi.ProjectsPath + "web"},
		} {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequestWithContext(ctx, req[0], req[1], strings.NewReader("{}")))
			if w.Code != http.StatusForbidden {
				t.Errorf("%s %s from %v: HTTP %d, want 403", req[0], req[1], ctx.Value(peerUIDKey{}), w.Code)
			}
		}
	}

	path := filepath.Join(t.TempDir(), "s")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if uid, ok := peerUID(s); !ok || uid != os.Getuid() {
		t.Errorf("peerUID: %d, %v; want %d", uid, ok, os.Getuid())
	}
}
