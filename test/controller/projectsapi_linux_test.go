package controller_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/ops"
	"github.com/vmnetctl/vmnetctl/statedir"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestProjectsAPI: the projects' API (PUT and DELETE /v1/projects/NAME),
// as a program that runs a fleet uses it, against a real controller: a
// project applied in one request runs when the answer comes (its helper
// up, its socket there) and again changes nothing; one that collides with
// another project's VM, names another networks.yaml, or would replace
// vmnetctl's own project or another file's is refused with nothing
// recorded, and a name that is no project's (a path elsewhere) is a bad
// request; eight applied at once
// all come up; a removed one's helper is gone, and removing it again is
// fine; and a controller started by `up` exits once the API removed the
// last project.
func TestProjectsAPI(t *testing.T) {
	h := newHost(t)
	first := h.WriteFile("first.yaml", "vms:\n  anchor:\n    networks: [{vmnet: shared}]\n")
	h.MustVmnetctl("up", "-f", first, "--metrics-addr", "off")
	sd := statedir.Dir{Path: h.StateDir()}
	cl := ops.NewClient(sd)
	snap, err := sd.Networks()
	if err != nil || snap == nil {
		t.Fatalf("networks of record: %v, %v", snap, err)
	}
	request := func(name, vms string) *ctlapi.ApplyRequest {
		return &ctlapi.ApplyRequest{
			Project:   statedir.Project{Name: name, Files: []statedir.ProjectFile{{Path: name + ".yaml", Data: []byte(vms)}}, UID: os.Getuid(), GID: os.Getgid()},
			Networks:  *snap,
			NameGiven: true,
		}
	}
	vm := func(name string) string { return fmt.Sprintf("vms:\n  %s:\n    networks: [{vmnet: shared}]\n", name) }
	ctx := context.Background()
	apply := func(req *ctlapi.ApplyRequest) *ctlapi.ApplyResponse {
		t.Helper()
		resp, err := cl.ApplyProject(ctx, req)
		if err != nil {
			t.Fatalf("apply %s: %v", req.Project.Name, err)
		}
		return resp
	}
	running := func(resp *ctlapi.ApplyResponse, vm string) ctlapi.AttachmentStatus {
		t.Helper()
		if !resp.Recorded || resp.Refused != "" || resp.Status == nil {
			t.Fatalf("apply of %s: %+v, want it recorded with a status", vm, resp)
		}
		for _, a := range resp.Status.Attachments {
			if a.VM == vm {
				if a.State != ctlapi.StateRunning {
					t.Fatalf("%s in the answer: %s (%s)", vm, a.State, a.Error)
				}
				if _, err := os.Stat(a.Socket); err != nil {
					t.Fatalf("%s's socket when the answer came: %v", vm, err)
				}
				return a
			}
		}
		t.Fatalf("the answer has no attachment for %s: %+v", vm, resp.Status.Attachments)
		return ctlapi.AttachmentStatus{}
	}

	web := running(apply(request("api1", vm("web"))), "web")
	if again := running(apply(request("api1", vm("web"))), "web"); again.PID != web.PID {
		t.Errorf("the same project applied again restarted its helper: pid %d, then %d", web.PID, again.PID)
	}
	h.Attachment(h.Status(), "web") // and `vmnetctl status` sees it

	// Refused, nothing recorded: a VM another project defines; another
	// networks.yaml (the CLI's up makes that change, planned against
	// every project).
	resp := apply(request("api2", vm("web")))
	if resp.Recorded || !strings.Contains(fmt.Sprint(resp.Resolve), `VM "web" is also defined`) {
		t.Errorf("a VM of another project: %+v, want it refused naming the VM", resp)
	}
	other := request("api3", vm("db"))
	other.Networks.Data = append([]byte("# another\n"), other.Networks.Data...)
	if resp, err := cl.ApplyProject(ctx, other); err == nil || !strings.Contains(err.Error(), "409") {
		t.Errorf("another networks.yaml: %+v, %v; want 409 Conflict", resp, err)
	}
	// vmnetctl's own project (a network kept up), a name that came from
	// another file's, a socket path too long to bind: refused, nothing
	// recorded. A name that is no project's: refused as a bad request,
	// never a path elsewhere.
	h.MustVmnetctl("network", "create", "isolated")
	own := request("network.isolated", vm("own"))
	taken := request("first", vm("other"))
	taken.NameGiven = false
	taken.Project.Files[0].Abs = h.WriteFile("elsewhere/first.yaml", vm("other"))
	for _, tc := range []struct {
		req  *ctlapi.ApplyRequest
		want string
	}{
		{own, "vmnetctl's own"},
		{taken, "-p NAME"},
	} {
		resp := apply(tc.req)
		if resp.Recorded || !strings.Contains(resp.Refused+fmt.Sprint(resp.Resolve), tc.want) {
			t.Errorf("%s: %+v, want it refused with %q", tc.req.Project.Name, resp, tc.want)
		}
	}
	if p, err := sd.Project("network.isolated"); err != nil || p == nil || len(p.Files) > 0 {
		t.Errorf("the network's own project after a refused apply: %+v, %v", p, err)
	}
	if p, err := sd.Project("first"); err != nil || p == nil || p.Files[0].Abs != first {
		t.Errorf("project first after an apply named after another file: %+v, %v", p, err)
	}
	if _, err := cl.ApplyProject(ctx, request("a/b", vm("slash"))); err == nil || !strings.Contains(err.Error(), "400") {
		t.Errorf("apply of project \"a/b\": %v, want 400", err)
	}
	if _, err := cl.RemoveProject(ctx, "../../controller"); err == nil || !strings.Contains(err.Error(), "400") {
		t.Errorf("remove of project \"../../controller\": %v, want 400", err)
	}
	for _, name := range []string{"api2", "api3"} {
		if p, err := sd.Project(name); p != nil || err != nil {
			t.Errorf("refused project %s recorded: %+v, %v", name, p, err)
		}
	}

	// Eight at once: one change at a time, each answered once its own
	// attachment runs.
	var wg sync.WaitGroup
	answers := make([]*ctlapi.ApplyResponse, 8)
	errs := make([]error, 8)
	for i := range answers {
		wg.Go(func() {
			answers[i], errs[i] = cl.ApplyProject(ctx, request(fmt.Sprintf("burst%d", i), vm(fmt.Sprintf("b%d", i))))
		})
	}
	wg.Wait()
	for i := range answers {
		if errs[i] != nil {
			t.Fatalf("burst%d: %v", i, errs[i])
		}
		running(answers[i], fmt.Sprintf("b%d", i))
	}

	// Removed: its helper gone when the answer comes; again, fine.
	for range 2 {
		r, err := cl.RemoveProject(ctx, "api1")
		if err != nil {
			t.Fatal(err)
		}
		if r.Error != "" {
			t.Errorf("remove: %s", r.Error)
		}
	}
	if err := syscall.Kill(web.PID, 0); err == nil {
		t.Errorf("web's helper (pid %d) runs after its project was removed", web.PID)
	}
	for _, a := range h.Status().Attachments {
		if a.VM == "web" {
			t.Errorf("web still in status: %+v", a)
		}
	}

	// The controller `up` started exits once the last project is gone,
	// also when the API took it away.
	names, err := sd.ProjectNames()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if _, err := cl.RemoveProject(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, time.Minute, func() bool { return !sd.ControllerAlive() }, "the controller to exit after the API removed the last project")
	h.MustVmnetctl("down", "--all")
}
