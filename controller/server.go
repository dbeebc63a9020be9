package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/user"
	"strconv"
	"time"

	"github.com/vmnetctl/vmnetctl/ctlapi"
)

// handler is the daemon API, served on the state dir's unix socket.
func (c *Controller) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", c.healthz)
	mux.HandleFunc("GET /v1/progress", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, c.progress.snapshot())
	})
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, c.status())
	})
	mux.HandleFunc("POST /v1/check", func(w http.ResponseWriter, r *http.Request) {
		if !mayChange(r) {
			http.Error(w, "check: only root may ask the controller to check a project; a group that networks.yaml names may read status", http.StatusForbidden)
			return
		}
		c.serveCheck(w, r)
	})
	mux.HandleFunc("POST /v1/reconcile", func(w http.ResponseWriter, r *http.Request) {
		if !mayChange(r) {
			http.Error(w, "reconcile: only root may ask the controller to reconcile; a group that networks.yaml names may read status", http.StatusForbidden)
			return
		}
		// As long as the client waits: a pass of thousands of helpers on
		// a busy machine takes what it takes (/healthz says if it is
		// stuck).
		resp := ctlapi.ReconcileResponse{}
		if err := c.waitReconcile(r.Context()); err != nil {
			resp.Error = err.Error()
		}
		c.mu.Lock()
		if c.lastErr != nil && resp.Error == "" {
			resp.Error = c.lastErr.Error()
		}
		c.mu.Unlock()
		// ?project=NAME: that project's part (what up prints), not the
		// status of every VM of the state dir.
		resp.Status = c.statusOf(r.URL.Query().Get("project"))
		resp.Stays = !c.opts.ExitWhenIdle
		writeJSON(w, resp)
	})
	return mux
}

// mayChange tells whether the client of r may change state: root or the
// controller's own user. A group that networks.yaml lets use the API reads
// status only.
func mayChange(r *http.Request) bool {
	uid, ok := r.Context().Value(peerUIDKey{}).(int)
	return ok && (uid == 0 || uid == os.Geteuid())
}

// healthz answers /healthz, of the API and of the metrics: ok, or 503 when
// the reconcile loop is stuck. Without the controller's lock, which a long
// pass holds.
func (c *Controller) healthz(w http.ResponseWriter, _ *http.Request) {
	if p := c.progress.snapshot(); p.Stuck(time.Now()) {
		http.Error(w, fmt.Sprintf("the reconcile loop is stuck: no progress in %q since %s", p.Phase, p.Moved.Format(time.RFC3339)), http.StatusServiceUnavailable)
		return
	}
	w.Write([]byte("ok\n"))
}

// serverIdle closes the API's and the metrics' idle keep-alive
// connections, so that clients cannot pin the controller's descriptors.
const serverIdle = 30 * time.Second

// peerUIDKey is the context key of the uid of the API client's process.
type peerUIDKey struct{}

// withPeerUID records, for the API's handlers, the uid of the process at
// the other end of a unix socket connection (SO_PEERCRED); none for
// another kind of connection, which the handlers then treat as no one's.
func withPeerUID(ctx context.Context, conn net.Conn) context.Context {
	if uid, ok := peerUID(conn); ok {
		return context.WithValue(ctx, peerUIDKey{}, uid)
	}
	return ctx
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

func lookupGroup(name string) (int, error) {
	g, err := user.LookupGroup(name)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(g.Gid)
}
