package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/user"
	"strconv"
	"strings"
	"time"

	"github.com/vmnetctl/vmnetctl/backend"
	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/spec"
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
		// ?project=NAME: that project's part (what up prints), not the
		// status of every VM of the state dir.
		writeJSON(w, c.converge(r.Context(), r.URL.Query().Get("project")))
	})
	mux.HandleFunc("PUT "+ctlapi.ProjectsPath+"{name}", func(w http.ResponseWriter, r *http.Request) {
		if !mayChange(r) {
			http.Error(w, "apply: only root may change the projects; a group that networks.yaml names may read status", http.StatusForbidden)
			return
		}
		c.serveApply(w, r)
	})
	mux.HandleFunc("DELETE "+ctlapi.ProjectsPath+"{name}", func(w http.ResponseWriter, r *http.Request) {
		if !mayChange(r) {
			http.Error(w, "remove: only root may change the projects; a group that networks.yaml names may read status", http.StatusForbidden)
			return
		}
		c.serveRemove(w, r)
	})
	mux.HandleFunc("GET /v1/capture", c.serveCapture)
	mux.HandleFunc("POST /v1/impair", c.serveImpair)
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
	// Compact: the clients decode it (the CLI indents what it prints),
	// and indenting a status of 10,000 VMs was a second copy of it, some
	// 6 MB of garbage an ask.
	json.NewEncoder(w).Encode(v)
}

func lookupGroup(name string) (int, error) {
	g, err := user.LookupGroup(name)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(g.Gid)
}

// serveCapture answers GET /v1/capture?vm=VM[&network=N][&count=N]
// [&duration=D][&filter=BPF][&ring=BYTES]: the frames of the VM's port as pcapng, as they pass,
// to root or the VM's owner only (a VM's traffic is its owner's to
// see), with what it captured in the trailer.
func (c *Controller) serveCapture(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	cp, ok := c.be.(backend.Capturer)
	if !ok {
		http.Error(w, "capture: the "+c.be.Name()+" backend cannot capture a VM's frames", http.StatusNotImplemented)
		return
	}
	o := backend.CaptureOptions{}
	var err error
	if s := q.Get("count"); s != "" {
		if o.Count, err = strconv.Atoi(s); err != nil || o.Count < 0 {
			http.Error(w, fmt.Sprintf("capture: count %q is not a number of frames", s), http.StatusBadRequest)
			return
		}
	}
	if s := q.Get("duration"); s != "" {
		if o.Duration, err = time.ParseDuration(s); err != nil || o.Duration < 0 {
			http.Error(w, fmt.Sprintf("capture: duration %q is not a duration like 10s", s), http.StatusBadRequest)
			return
		}
	}
	if s := q.Get("filter"); s != "" {
		if o.Filter, err = ctlapi.DecodeFilter(s); err != nil {
			http.Error(w, "capture: "+err.Error(), http.StatusBadRequest)
			return
		}
	}
	if s := q.Get("ring"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < minRing || n > maxRing {
			http.Error(w, fmt.Sprintf("capture: ring %q is not a size from %d KiB to %d MiB", s, minRing>>10, maxRing>>20), http.StatusBadRequest)
			return
		}
		o.Ring = n
	}
	port, name, network, owner, err := c.capturePort(q.Get("vm"), q.Get("network"))
	if err != nil {
		http.Error(w, "capture: "+err.Error(), http.StatusNotFound)
		return
	}
	if uid, ok := r.Context().Value(peerUIDKey{}).(int); !ok || uid != 0 && uid != os.Geteuid() && uid != owner {
		http.Error(w, fmt.Sprintf("capture: only root or the VM's owner (uid %d) may capture %s's frames", owner, name), http.StatusForbidden)
		return
	}
	if c.captures.Add(1) > maxCaptures {
		c.captures.Add(-1)
		http.Error(w, fmt.Sprintf("capture: %d captures run already; end one first", maxCaptures), http.StatusServiceUnavailable)
		return
	}
	defer c.captures.Add(-1)
	o.Name = name
	if o.Ring > 0 {
		o.Until = c.dropBurst(network, port)
	}
	w.Header().Set("Content-Type", "application/x-pcapng")
	w.Header().Set("Trailer", ctlapi.CaptureTrailer)
	// The answer begins once the socket is bound: the client knows every
	// frame from then on is captured; what fails before is an error.
	bound := false
	o.Bound = func() {
		bound = true
		w.WriteHeader(http.StatusOK)
		http.NewResponseController(w).Flush()
	}
	st, err := cp.Capture(r.Context(), port, o, flushWriter{w})
	if !bound {
		w.Header().Del("Trailer")
		if err == nil {
			err = errors.New("ended before it began")
		}
		http.Error(w, "capture: "+err.Error(), http.StatusInternalServerError)
		return
	}
	trailer := fmt.Sprintf("frames=%d dropped=%d", st.Frames, st.Dropped)
	if st.Ended != "" {
		trailer += " ended=" + strconv.Quote(st.Ended)
	}
	if err != nil {
		trailer += "; " + err.Error()
	}
	w.Header().Set(ctlapi.CaptureTrailer, trailer)
}

// maxCaptures bounds the captures that run at once: each holds a packet
// socket with a buffer of megabytes, and its client may never read; a
// flight recorder holds its ring, at most maxRing.
const (
	maxCaptures = 8
	minRing     = 64 << 10
	maxRing     = 64 << 20
)

// flightDropBurst is what a flight recorder takes for a burst of the
// guard's drops: that many of the VM's frames dropped within a second
// (a VM that sends from an address not its own, say) ends it.
const flightDropBurst = 20

// dropBurst is a flight recorder's Until: it reads the guard's drops on
// port (of network) once a second, and says so when they jumped by
// flightDropBurst or more since the last read.
func (c *Controller) dropBurst(network, port string) func() string {
	c.mu.Lock()
	nw := c.nets[network]
	c.mu.Unlock()
	if nw == nil {
		return nil
	}
	var last uint64
	var at time.Time
	return func() string {
		if time.Since(at) < time.Second {
			return ""
		}
		first := at.IsZero()
		at = time.Now()
		d := nw.Stats(backend.StatsQuery{Ports: []string{port}}).GuardDrops[port]
		defer func() { last = d }()
		if !first && d >= last+flightDropBurst {
			return fmt.Sprintf("the guard dropped %d of the VM's frames within a second", d-last)
		}
		return ""
	}
}

// capturePort is the port of vm's attachment (on network, if several),
// its name in a capture, its network and its owner's uid.
func (c *Controller) capturePort(vm, network string) (port, name, netID string, owner int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	a, owner, err := c.findAttachmentLocked(vm, network)
	if err != nil {
		return "", "", "", 0, err
	}
	h := c.helpers[a.Key()]
	if h == nil || h.state != ctlapi.StateRunning || h.rec.Tap == "" {
		return "", "", "", 0, fmt.Errorf("%s on %s has no port: its helper does not run", a.Key(), a.Network)
	}
	return h.rec.Tap, fmt.Sprintf("%s on %s", a.Key(), a.Network), a.Network, owner, nil
}

// findAttachmentLocked is vm's attachment that is up (to network, if it
// has several) and its project's owner's uid (-1 for none known). Call
// with c.mu held.
func (c *Controller) findAttachmentLocked(vm, network string) (*spec.Attachment, int, error) {
	var found []*spec.Attachment
	if c.applied != nil {
		for _, a := range c.applied.Attachments {
			if a.VM == vm && (network == "" || a.Network == network) {
				found = append(found, a)
			}
		}
	}
	switch {
	case len(found) == 0 && network != "":
		return nil, 0, fmt.Errorf("VM %q has no attachment on network %q%s", vm, network, spec.SuggestVM(c.applied, vm))
	case len(found) == 0:
		return nil, 0, fmt.Errorf("VM %q is not up%s", vm, spec.SuggestVM(c.applied, vm))
	case len(found) > 1:
		var nets []string
		for _, a := range found {
			nets = append(nets, a.Network)
		}
		return nil, 0, fmt.Errorf("VM %q is on several networks (%s): choose one with --network", vm, strings.Join(nets, ", "))
	}
	a := found[0]
	owner := -1
	for _, p := range c.appliedP {
		if p.Name == a.Project {
			owner = p.UID
		}
	}
	return a, owner, nil
}

// flushWriter hands each write to the client at once: a capture is
// read live.
type flushWriter struct{ w http.ResponseWriter }

func (f flushWriter) Write(b []byte) (int, error) {
	n, err := f.w.Write(b)
	if fl, ok := f.w.(http.Flusher); ok {
		fl.Flush()
	}
	return n, err
}
