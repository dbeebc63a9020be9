package controller

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/helperexec"
)

// Helper states, as `status` shows them.
const (
	StateStarting = "starting"
	StateRunning  = "running"
	StateBackoff  = "backoff"
	StateStopped  = "stopped"
	StateFailed   = "failed"
)

// HelperRecord is what the controller persists about a running helper, so
// that a new controller can adopt it after a crash.
type HelperRecord struct {
	Key       string         `json:"key"`
	VM        string         `json:"vm"`
	Index     int            `json:"index"`
	Network   string         `json:"network"`
	Project   string         `json:"project"`
	MAC       string         `json:"mac"`
	Attach    api.AttachKind `json:"attach"`
	Proc      ProcIdentity   `json:"proc"`
	Socket    string         `json:"socket,omitempty"`
	Tap       string         `json:"tap,omitempty"`
	Ready     string         `json:"ready"`
	StartedAt time.Time      `json:"startedAt"`
	Restarts  int            `json:"restarts"`
}

// helperProc is one supervised helper.
type helperProc struct {
	rec     HelperRecord
	att     *Attachment
	state   string
	lastErr string
	exited  chan struct{} // closed when the process is gone
	backoff Backoff
	retryAt time.Time
	cmd     *exec.Cmd // nil for an adopted helper
	logPath string
	// startLatency is how long the helper took from exec to ready.
	startLatency time.Duration
	stats        helperexec.Stats
	statsOff     int64
}

// fileKey turns an attachment key ("vm/0") into a file name ("vm.0").
func fileKey(key string) string { return strings.ReplaceAll(key, "/", ".") }

// InterfaceID derives the helper's --interface-id from the attachment, so
// the helper's side of the cable keeps its MAC across restarts.
func InterfaceID(a *Attachment) string {
	sum := sha256.Sum256([]byte("vmnetctl/" + a.VM + "/" + strconv.Itoa(a.Index) + "/" + a.MAC))
	sum[6] = sum[6]&0x0f | 0x50 // version 5 style
	sum[8] = sum[8]&0x3f | 0x80
	return fmt.Sprintf("%X-%X-%X-%X-%X", sum[0:4], sum[4:6], sum[6:8], sum[8:10], sum[10:16])
}

// SocketPath is where the helper of an attachment serves the VM.
func (s StateDir) SocketPath(vm string, index int) string {
	return s.File(vmsDir, vm, strconv.Itoa(index)+".sock")
}

// ClientSocketPath is where a VMM such as qemu binds its end of the cable.
func (s StateDir) ClientSocketPath(vm string, index int) string {
	return s.File(vmsDir, vm, strconv.Itoa(index)+".vm.sock")
}

// launchHelper starts `vmnetctl helper` for a and waits until it is ready:
// its JSON line was written and, in socket mode, its socket exists. Its
// stdout and stderr go to files of the state dir, not pipes, so that it
// outlives a crash of the controller and can be adopted.
func (c *Controller) launchHelper(ctx context.Context, a *Attachment, n *api.Network, owner *Project) (*helperProc, error) {
	key := fileKey(a.Key())
	readyPath := c.sd.File(helpersDir, key+".json")
	logPath := c.sd.File(helpersDir, key+".log")
	if err := os.MkdirAll(c.sd.File(helpersDir), 0o750); err != nil {
		return nil, err
	}
	vmDir := c.sd.File(vmsDir, a.VM)
	if err := os.MkdirAll(vmDir, 0o750); err != nil {
		return nil, err
	}
	if owner.UID >= 0 {
		// The helper creates its socket in vmDir after dropping to the VM's
		// owner, and the owner's VMM binds its own beside it: the owner
		// must be able to pass through the state dir and vms/ (not list
		// them: mode 0711).
		for _, d := range []string{c.sd.Path, c.sd.File(vmsDir)} {
			if err := os.Chmod(d, 0o711); err != nil {
				return nil, err
			}
		}
		if err := os.Chown(vmDir, owner.UID, owner.GID); err != nil {
			return nil, fmt.Errorf("giving %s to uid %d: %w", vmDir, owner.UID, err)
		}
	}
	sock := c.sd.SocketPath(a.VM, a.Index)
	args := []string{"helper", "--networks", c.sd.File(networksYAMLFile), "--network", n.ID,
		"--interface-id", InterfaceID(a), "--stats-interval", strconv.FormatFloat(c.opts.StatsInterval.Seconds(), 'f', -1, 64)}
	if owner.UID >= 0 {
		args = append(args, "--uid", strconv.Itoa(owner.UID), "--gid", strconv.Itoa(owner.GID))
	}
	if n.Isolation {
		args = append(args, "--enable-isolation")
	}
	if a.Attach == api.AttachTAP {
		args = append(args, "--attach", "tap")
		sock = ""
	} else {
		// A helper that was killed leaves its socket and lock behind.
		os.Remove(sock)
		os.Remove(sock + ".lock")
		args = append(args, "--socket", sock)
	}
	ready, err := os.OpenFile(readyPath, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return nil, err
	}
	defer ready.Close()
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	logStart, _ := logf.Seek(0, io.SeekEnd)

	cmd := exec.Command(c.opts.Executable, args...)
	cmd.Stdout, cmd.Stderr = ready, logf
	cmd.Env = helperEnv()
	// Its own process group: signals to the controller's group (Ctrl-C, a
	// service manager stopping the controller) do not reach VMs' cables.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	began := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting helper for %s: %w", a.Key(), err)
	}
	h := &helperProc{att: a, cmd: cmd, exited: make(chan struct{}), logPath: logPath, state: StateStarting}
	go func() {
		cmd.Wait()
		close(h.exited)
		c.kick()
	}()
	line, err := waitReady(ctx, readyPath, sock, h.exited, c.opts.ReadyTimeout)
	if err != nil {
		c.stopProc(h)
		return nil, fmt.Errorf("helper for %s on network %s: %w%s", a.Key(), n.ID, err, logTail(logPath, logStart))
	}
	r, err := helperexec.ParseReady(line)
	if err != nil {
		c.stopProc(h)
		return nil, fmt.Errorf("helper for %s: %w", a.Key(), err)
	}
	id, err := ReadProcIdentity(cmd.Process.Pid)
	if err != nil {
		c.stopProc(h)
		return nil, fmt.Errorf("helper for %s: %w", a.Key(), err)
	}
	h.rec = HelperRecord{Key: a.Key(), VM: a.VM, Index: a.Index, Network: n.ID, Project: a.Project, MAC: a.MAC,
		Attach: a.Attach, Proc: id, Socket: sock, Tap: r.TapName, Ready: string(bytes.TrimSpace(line)), StartedAt: time.Now()}
	h.statsOff = logStart
	h.startLatency = time.Since(began)
	h.state = StateRunning
	return h, nil
}

// helperEnv is the controller's environment without sudo's variables: the
// helper gets its user from --uid and --gid.
func helperEnv() []string {
	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "SUDO_") {
			env = append(env, e)
		}
	}
	return env
}

var errExited = errors.New("exited before it was ready")

// waitReady polls for the helper's JSON line and socket until timeout.
func waitReady(ctx context.Context, readyPath, sock string, exited <-chan struct{}, timeout time.Duration) ([]byte, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		data, _ := os.ReadFile(readyPath)
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			if sock == "" {
				return data[:i], nil
			}
			if _, err := os.Stat(sock); err == nil {
				return data[:i], nil
			}
		}
		select {
		case <-exited:
			return nil, errExited
		case <-deadline.C:
			return nil, fmt.Errorf("not ready after %s", timeout)
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
		}
	}
}

// logTail returns the helper's log lines written since offset, for errors.
func logTail(path string, offset int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return ""
	}
	var lines []string
	sc := bufio.NewScanner(io.LimitReader(f, 64<<10))
	for sc.Scan() {
		if _, isStats := helperexec.ParseStatsLine(sc.Text()); !isStats {
			lines = append(lines, sc.Text())
		}
	}
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	if len(lines) == 0 {
		return ""
	}
	return "\nhelper's stderr:\n  " + strings.Join(lines, "\n  ")
}

// stopProc stops a helper: SIGTERM to its process group, SIGKILL after the
// grace period. It returns once the helper is gone.
func (c *Controller) stopProc(h *helperProc) {
	pid := h.rec.Proc.PID
	if h.cmd != nil {
		pid = h.cmd.Process.Pid
	} else if !h.rec.Proc.Alive() {
		return // adopted, and gone or no longer the process we recorded
	}
	syscall.Kill(-pid, syscall.SIGTERM)
	syscall.Kill(pid, syscall.SIGTERM)
	select {
	case <-h.exited:
		return
	case <-time.After(c.opts.StopGrace):
	}
	c.log.Warn("helper did not stop on SIGTERM; killing it", "attachment", h.rec.Key, "pid", pid)
	syscall.Kill(-pid, syscall.SIGKILL)
	syscall.Kill(pid, syscall.SIGKILL)
	<-h.exited
}

// adopt takes over a helper that a previous controller started and that
// still runs: the same pid, start time and command line.
func (c *Controller) adopt(rec HelperRecord) *helperProc {
	h := &helperProc{rec: rec, exited: make(chan struct{}), state: StateRunning,
		logPath: c.sd.File(helpersDir, fileKey(rec.Key)+".log")}
	if fi, err := os.Stat(h.logPath); err == nil {
		h.statsOff = max(0, fi.Size()-4096) // pick up the latest stats line
	}
	go func() {
		waitExit(rec.Proc)
		close(h.exited)
		c.kick()
	}()
	return h
}
