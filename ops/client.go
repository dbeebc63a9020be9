package ops

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/helperexec"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// Client talks to the controller of a state dir over its unix socket.
type Client struct {
	sd   statedir.Dir
	http *http.Client
}

// NewClient returns a client for the controller of sd.
func NewClient(sd statedir.Dir) *Client {
	path := sd.APISocket()
	return &Client{sd: sd, http: &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
	}}}
}

// Running reports whether a controller answers on the socket.
func (cl *Client) Running(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://vmnetctl/healthz", nil)
	resp, err := cl.http.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Status returns the live status.
func (cl *Client) Status(ctx context.Context) (*ctlapi.Status, error) {
	st := &ctlapi.Status{}
	return st, cl.do(ctx, http.MethodGet, "/v1/status", st)
}

// Progress returns what the controller's reconcile loop is doing.
func (cl *Client) Progress(ctx context.Context) (*ctlapi.Progress, error) {
	p := &ctlapi.Progress{}
	return p, cl.do(ctx, http.MethodGet, "/v1/progress", p)
}

// Reconcile asks the controller to converge and returns the result.
func (cl *Client) Reconcile(ctx context.Context) (*ctlapi.ReconcileResponse, error) {
	return cl.ReconcileProject(ctx, "")
}

// ReconcileProject is Reconcile, answered with the status of project's
// attachments and networks only ("" for everything's).
func (cl *Client) ReconcileProject(ctx context.Context, project string) (*ctlapi.ReconcileResponse, error) {
	resp := &ctlapi.ReconcileResponse{}
	path := "/v1/reconcile"
	if project != "" {
		path += "?project=" + url.QueryEscape(project)
	}
	return resp, cl.do(ctx, http.MethodPost, path, resp)
}

func (cl *Client) do(ctx context.Context, method, path string, v any) error {
	_, err := cl.call(ctx, method, path, nil, v)
	return err
}

// call sends body (if not nil) to path and decodes the answer into v; the
// HTTP status is 0 when no answer came.
func (cl *Client) call(ctx context.Context, method, path string, body []byte, v any) (int, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://vmnetctl"+path, rd)
	if err != nil {
		return 0, err
	}
	resp, err := cl.http.Do(req)
	if err != nil {
		return 0, fmt.Errorf("controller API: %w", err)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, fmt.Errorf("controller API %s: %s: %s", path, resp.Status, bytes.TrimSpace(answer))
	}
	return resp.StatusCode, json.Unmarshal(answer, v)
}

// ErrControllerExited is EnsureController's report that the controller it
// started ran and exited cleanly before it answered: with no project
// recorded, a controller removes what is left and exits.
var ErrControllerExited = errors.New("the controller ran and exited: no project is left")

// EnsureController starts `exe serve` in the background for sd unless a
// controller already runs, and waits until it answers. Its output goes to
// controller.log in the state dir, whose tail is in the error if it fails.
//
// A controller lock held by a process that does not answer is one that is
// starting, or one that was killed and whose lock the kernel has not
// released yet: the wait goes on trying the lock, and starts a controller
// once it is free.
func EnsureController(ctx context.Context, sd statedir.Dir, exe string, extraArgs ...string) error {
	cl := NewClient(sd)
	if cl.Running(ctx) {
		return nil
	}
	if err := sd.Init(); err != nil {
		return err
	}
	var exited chan error // the controller this call started: its exit
	var watch *helperexec.StallWatch
	var lastExit error
	start := func() error {
		logf, err := statedir.OpenLog(sd.ControllerLog())
		if err != nil {
			return err
		}
		defer logf.Close()
		args := append([]string{"serve", "--state-dir", sd.Path, "--" + ctlapi.ExitWhenIdleFlag}, extraArgs...)
		cmd := exec.Command(exe, args...)
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.Env = os.Environ()
		// A session of its own: it outlives the command that started it.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("starting controller: %w", err)
		}
		exited = make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		watch = helperexec.NewStallWatch(cmd.Process.Pid, controllerStartStall, func() int64 {
			fi, err := os.Stat(sd.ControllerLog())
			if err != nil {
				return 0
			}
			return fi.Size()
		}, "controller")
		return nil
	}
	var result error
	err := waitStarting(ctx, func() *helperexec.StallWatch {
		if exited == nil {
			return nil
		}
		return watch
	}, func() bool {
		if cl.Running(ctx) {
			return true
		}
		select {
		case err := <-exited:
			if err == nil {
				result = ErrControllerExited
				return true
			}
			lastExit, exited = err, nil // lost a race for the lock, or failed: try again
		default:
		}
		if exited != nil {
			return false
		}
		l, err := sd.TryLockController()
		if err == nil {
			l.Unlock()
			if err := start(); err != nil {
				result = err
				return true
			}
		} else if !errors.Is(err, statedir.ErrLocked) {
			result = err
			return true
		}
		return false
	})
	if err == nil || ctx.Err() != nil {
		if err == nil {
			return result
		}
		return err
	}
	tail, _ := os.ReadFile(sd.ControllerLog())
	lines := strings.Split(strings.TrimSpace(string(tail)), "\n")
	if len(lines) > 10 {
		lines = lines[len(lines)-10:]
	}
	why := ""
	if lastExit != nil {
		why = fmt.Sprintf(" (it exited: %v)", lastExit)
	}
	return fmt.Errorf("controller did not start%s: %v; its log (%s):\n  %s", why, err, sd.ControllerLog(), strings.Join(lines, "\n  "))
}

// controllerStartStall is how long a controller that starts may make no
// progress (EnsureController); as long while one held by another process
// neither answers nor frees its lock.
var controllerStartStall = 15 * time.Second

// waitStarting waits until cond holds. While ours (the watch of the
// controller this call started, nil for none) moves, however slowly, it
// waits on: a busy machine makes a controller slow, not failed. It fails
// once that controller made no progress for controllerStartStall, or when
// it has none of its own to watch and controllerStartStall passed.
func waitStarting(ctx context.Context, ours func() *helperexec.StallWatch, cond func() bool) error {
	deadline := time.Now().Add(controllerStartStall)
	return poll(ctx, func() (bool, error) {
		if cond() {
			return true, nil
		}
		now := time.Now()
		if w := ours(); w != nil {
			if err := w.Check(now); err != nil {
				return false, err
			}
			deadline = now.Add(controllerStartStall)
		} else if now.After(deadline) {
			return false, fmt.Errorf("no answer within %s", controllerStartStall)
		}
		return false, nil
	})
}

// ApplyProject asks the controller to check, record and converge a
// project (PUT /v1/projects/NAME), and waits for its answer as long as
// the pass takes. An error wrapping errNotApplied when the caller may
// make the change itself (notTaken); any other error is the command's.
func (cl *Client) ApplyProject(ctx context.Context, req *ctlapi.ApplyRequest) (*ctlapi.ApplyResponse, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	resp := &ctlapi.ApplyResponse{}
	if status, err := cl.call(ctx, http.MethodPut, ctlapi.ProjectsPath+url.PathEscape(req.Project.Name), body, resp); err != nil {
		return nil, notTaken(ctx, status, err)
	}
	return resp, nil
}

// RemoveProject asks the controller to remove a project and stop its
// helpers (DELETE /v1/projects/NAME); errors as ApplyProject's.
func (cl *Client) RemoveProject(ctx context.Context, name string) (*ctlapi.ReconcileResponse, error) {
	resp := &ctlapi.ReconcileResponse{}
	if status, err := cl.call(ctx, http.MethodDelete, ctlapi.ProjectsPath+url.PathEscape(name), nil, resp); err != nil {
		return nil, notTaken(ctx, status, err)
	}
	return resp, nil
}

// errNotApplied: the controller did not take a change of the projects'
// API; the command makes it itself.
var errNotApplied = errors.New("not applied by the controller")

// notTaken is err wrapping errNotApplied when the command may make a
// change of the projects' API itself: the controller refused it as a
// whole, having done nothing (an older controller: 404 or 405; not the
// networks.yaml of record: 409; too large: 413; exiting: 503), or no
// answer came (none listens; or a controller that was killed, whose
// socket took the connection as it died: "connection reset"). A change
// the controller had recorded before it died is recorded again, the
// same, and converged by the controller the command starts. Otherwise
// (the command gave up, a refusal of the request itself) it is err.
func notTaken(ctx context.Context, status int, err error) error {
	if ctx.Err() != nil {
		return err
	}
	switch status {
	case 0, http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusConflict, http.StatusRequestEntityTooLarge, http.StatusServiceUnavailable:
		return fmt.Errorf("%w: %v", errNotApplied, err)
	}
	return err
}
