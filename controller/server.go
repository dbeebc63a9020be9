package controller

import (
	"context"
	"encoding/json"
	"net/http"
	"os/user"
	"strconv"
	"time"
)

// ReconcileResponse answers POST /v1/reconcile.
type ReconcileResponse struct {
	Error  string  `json:"error,omitempty"`
	Status *Status `json:"status"`
	// Stays is set by a controller that keeps running with no project
	// (a service); one run with --exit-when-idle exits then.
	Stays bool `json:"stays,omitempty"`
}

// handler is the daemon API, served on the state dir's unix socket.
func (c *Controller) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, c.status())
	})
	mux.HandleFunc("POST /v1/reconcile", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Minute)
		defer cancel()
		resp := ReconcileResponse{}
		if err := c.waitReconcile(ctx); err != nil {
			resp.Error = err.Error()
		}
		c.mu.Lock()
		if c.lastErr != nil && resp.Error == "" {
			resp.Error = c.lastErr.Error()
		}
		c.mu.Unlock()
		resp.Status = c.status()
		resp.Stays = !c.opts.ExitWhenIdle
		writeJSON(w, resp)
	})
	return mux
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
