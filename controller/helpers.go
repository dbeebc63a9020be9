package controller

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/backend"
	"github.com/vmnetctl/vmnetctl/helperexec"
	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// Helper states, as `status` shows them.
const (
	StateStarting = "starting"
	StateRunning  = "running"
	StateBackoff  = "backoff"
	StateStopped  = "stopped"
	StateFailed   = "failed"
)

// helperProc is one supervised helper.
type helperProc struct {
	rec     statedir.HelperRecord
	att     *Attachment
	state   string
	lastErr string
	exited  <-chan struct{} // closed when the process is gone
	backoff Backoff
	retryAt time.Time
	proc    *helperexec.Helper // nil for an adopted helper
	logPath string
	// startLatency is how long the helper took from exec to ready.
	startLatency time.Duration
	stats        helperproto.Stats
	statsOff     int64
}

// closedChan is an exited channel for a helper that is not running.
func closedChan() <-chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}

// launchHelper starts `vmnetctl helper` for a and waits until it is ready:
// its JSON line was written and, in socket mode, its socket exists. Its
// stdout and stderr go to files of the state dir, not pipes, so that it
// outlives a crash of the controller and can be adopted.
func (c *Controller) launchHelper(ctx context.Context, a *Attachment, n *api.Network, owner *statedir.Project) (*helperProc, error) {
	readyPath := c.sd.HelperReadyFile(a.Key())
	logPath := c.sd.HelperLogFile(a.Key())
	if err := os.MkdirAll(c.sd.HelpersDir(), 0o750); err != nil {
		return nil, err
	}
	vmDir := c.sd.VMDir(a.VM)
	if err := os.MkdirAll(vmDir, 0o750); err != nil {
		return nil, err
	}
	if owner.UID >= 0 {
		// The helper creates its socket in vmDir after dropping to the VM's
		// owner, and the owner's VMM binds its own beside it: the owner
		// must be able to pass through the state dir and vms/ (not list
		// them: mode 0711).
		for _, d := range []string{c.sd.Path, c.sd.VMsDir()} {
			if err := os.Chmod(d, 0o711); err != nil {
				return nil, err
			}
		}
		if err := os.Chown(vmDir, owner.UID, owner.GID); err != nil {
			return nil, fmt.Errorf("giving %s to uid %d: %w", vmDir, owner.UID, err)
		}
	}
	if err := c.be.Cleanup(a.Attachment); err != nil {
		return nil, fmt.Errorf("helper for %s: %w", a.Key(), err)
	}
	sock := c.sd.SocketPath(a.VM, a.Index)
	if a.Attach == api.AttachTAP {
		sock = ""
	} else {
		// A helper that was killed leaves its socket and lock behind.
		os.Remove(sock)
		os.Remove(sock + ".lock")
	}
	argv, err := c.be.HelperCommand(backend.HelperSpec{Executable: c.opts.Executable, Attachment: a.Attachment, Network: n, UID: owner.UID, GID: owner.GID,
		Socket: sock, FD: -1, NetworksFile: c.sd.NetworksYAML(), VMNetHelperPath: c.paths.VMNetHelper, StatsInterval: c.opts.StatsInterval})
	if err != nil {
		return nil, fmt.Errorf("helper for %s on network %s: %w", a.Key(), n.ID, err)
	}
	var logStart int64
	if fi, err := os.Stat(logPath); err == nil {
		logStart = fi.Size()
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = helperEnv(owner)
	began := time.Now()
	// Output to files, not pipes: the helper outlives a crash of the
	// controller and can be adopted. helperexec puts it in its own process
	// group, so signals to the controller's group do not reach VMs' cables.
	proc, err := helperexec.Start(ctx, cmd, helperexec.StartOptions{SocketPath: sock, ReadyTimeout: c.opts.ReadyTimeout,
		StopGrace: c.opts.StopGrace, ReadyFile: readyPath, LogFile: logPath})
	if err != nil {
		return nil, fmt.Errorf("helper for %s on network %s: %w", a.Key(), n.ID, err)
	}
	go func() {
		<-proc.Done()
		c.kick()
	}()
	h := &helperProc{att: a, proc: proc, exited: proc.Done(), logPath: logPath, state: StateRunning,
		statsOff: logStart, startLatency: time.Since(began)}
	id, err := helperexec.ReadProcIdentity(proc.Pid())
	if err != nil {
		proc.Stop()
		return nil, fmt.Errorf("helper for %s: %w", a.Key(), err)
	}
	ready, _ := proc.Ready.MarshalJSON()
	h.rec = statedir.HelperRecord{Key: a.Key(), VM: a.VM, Index: a.Index, Network: n.ID, Project: a.Project, MAC: a.MAC,
		Attach: a.Attach, Proc: id, Socket: sock, Tap: proc.Ready.TapName, Ready: string(ready), StartedAt: time.Now()}
	return h, nil
}

// helperEnv is the controller's environment with sudo's ids set to the
// VM's owner: vmnet-helper drops its privileges to $SUDO_UID and $SUDO_GID
// (ours takes --uid and --gid, which say the same).
func helperEnv(owner *statedir.Project) []string {
	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "SUDO_") {
			env = append(env, e)
		}
	}
	if owner != nil && owner.UID >= 0 {
		env = append(env, "SUDO_UID="+strconv.Itoa(owner.UID), "SUDO_GID="+strconv.Itoa(owner.GID))
	}
	return env
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
		if _, isStats := helperproto.ParseStatsLine(sc.Text()); !isStats {
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

// stopProc stops a helper: SIGTERM, then SIGKILL after the grace period.
// It returns once the helper is gone. Signals go to the helper's pid only:
// its root child must live on to delete its TAP.
func (c *Controller) stopProc(h *helperProc) {
	if h.proc != nil {
		if err := h.proc.Stop(); err != nil {
			c.log.Warn("stopping helper", "attachment", h.rec.Key, "err", err)
		}
		return
	}
	if !h.rec.Proc.Alive() {
		return // adopted, and gone or no longer the process we recorded
	}
	pid := h.rec.Proc.PID
	syscall.Kill(pid, syscall.SIGTERM)
	select {
	case <-h.exited:
		return
	case <-time.After(c.opts.StopGrace):
	}
	c.log.Warn("helper did not stop on SIGTERM; killing it", "attachment", h.rec.Key, "pid", pid)
	syscall.Kill(pid, syscall.SIGKILL)
	<-h.exited
}

// adopt takes over a helper that a previous controller started and that
// still runs: the same pid, start time and command line.
func (c *Controller) adopt(rec statedir.HelperRecord) *helperProc {
	exited := make(chan struct{})
	h := &helperProc{rec: rec, exited: exited, state: StateRunning,
		logPath: c.sd.HelperLogFile(rec.Key)}
	if fi, err := os.Stat(h.logPath); err == nil {
		h.statsOff = max(0, fi.Size()-4096) // pick up the latest stats line
	}
	go func() {
		rec.Proc.WaitExit()
		close(exited)
		c.kick()
	}()
	return h
}
