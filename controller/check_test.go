package controller

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vmnetctl/vmnetctl/ops"
	"github.com/vmnetctl/vmnetctl/spec/spectest"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// TestCheckWithController: `up`'s check of a project beside the others
// gives the same verdict whether the controller answers it (from the
// projects it has parsed) or the command parses them itself: a VM that
// another project defines, and a fixed address that another project's VM
// has, are refused both ways, naming both projects; a project that
// collides with nothing passes both ways; with no controller, one
// without /v1/check or one that fails it, the command checks by itself.
func TestCheckWithController(t *testing.T) {
	sd := statedir.Dir{Path: filepath.Join(t.TempDir(), "state")}
	if err := sd.Init(); err != nil {
		t.Fatal(err)
	}
	snap := statedir.NetworksSnapshot{Source: "networks.yaml", Data: []byte(spectest.Networks)}
	if err := sd.SaveNetworks(snap); err != nil {
		t.Fatal(err)
	}
	if err := sd.SaveProject(spectest.Project("fleet", spectest.VMs)); err != nil {
		t.Fatal(err)
	}
	c, err := New(Options{StateDir: sd, Log: slog.New(slog.DiscardHandler), MetricsAddr: "off"})
	if err != nil {
		t.Fatal(err)
	}
	// The controller has parsed fleet, as after a pass.
	projects, _ := sd.Projects()
	nets, err := snap.Load()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.resolver.Resolve(nets, projects, nil); err != nil {
		t.Fatal(err)
	}

	serve := func(h http.Handler) func() {
		ln, err := c.listen()
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: h, ConnContext: withPeerUID}
		go srv.Serve(ln)
		return func() { srv.Close() }
	}
	var read atomic.Int32 // the command's reads of every project
	check := func(vms string) error {
		t.Helper()
		in := &ops.Input{Networks: snap, Files: []statedir.ProjectFile{{Path: "one.yaml", Data: []byte(vms)}}, Project: "one"}
		env := ops.Env{StateDir: sd, Stderr: &bytes.Buffer{}}
		l, err := in.Load(env)
		if err != nil {
			t.Fatal(err)
		}
		// The others are read only when parsed here: an up that the
		// controller checks does not read every project's record.
		_, err = l.CheckedDesired(context.Background(), env, func() ([]*statedir.Project, error) {
			read.Add(1)
			return sd.Projects()
		}, true)
		return err
	}
	cases := []struct {
		vms  string
		want string // in the error; "" for none
	}{
		{"vms:\n  web:\n    networks: [{vmnet: shared}]\n", `VM "web" is also defined at`},
		{"vms:\n  other:\n    networks: [{vmnet: shared, ip: 192.168.105.20}]\n", "192.168.105.20"},
		{"vms:\n  solo:\n    networks: [{vmnet: shared}]\n", ""},
	}
	verdicts := func(how string) []string {
		var out []string
		for _, tc := range cases {
			err := check(tc.vms)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("%s: %q refused: %v", how, tc.vms, err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("%s: %q: error %v, want one with %q", how, tc.vms, err, tc.want)
			}
			out = append(out, errString(err))
		}
		return out
	}
	local := verdicts("no controller")
	if read.Load() == 0 {
		t.Error("the command checked by itself without reading the other projects")
	}
	read.Store(0)
	var asked atomic.Int32
	h := c.handler()
	stop := serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/check" {
			asked.Add(1)
		}
		h.ServeHTTP(w, r)
	}))
	remote := verdicts("the controller")
	stop()
	if n := read.Load(); n != 0 {
		t.Errorf("the command read every project %d times while the controller checked", n)
	}
	if int(asked.Load()) != len(cases) {
		t.Errorf("the controller was asked %d times, want %d", asked.Load(), len(cases))
	}
	for i := range local {
		if local[i] != remote[i] {
			t.Errorf("%q: the controller says %q, the command by itself %q", cases[i].vms, remote[i], local[i])
		}
	}
	if !strings.Contains(remote[0], "projects one and fleet") && !strings.Contains(remote[0], "projects fleet and one") {
		t.Errorf("the collision does not name both projects: %s", remote[0])
	}
	// A controller that predates /v1/check (404), or one that cannot
	// check (500: its networks gone as it exits idle): checked here.
	for _, h := range []http.Handler{http.NewServeMux(), http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "check: no networks.yaml of record", http.StatusInternalServerError)
	})} {
		stop = serve(h)
		other := verdicts("a controller that cannot check")
		stop()
		if other[0] != local[0] {
			t.Errorf("with a controller that cannot check: %q, want %q", other[0], local[0])
		}
	}
	// What the controller checks is not cached: the checked project is
	// still unknown to its parse cache.
	if c.resolver.Parsed("one") {
		t.Error("a check put the project it checked in the controller's parse cache")
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
