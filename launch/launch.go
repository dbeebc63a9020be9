package launch

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/backend"
	"github.com/vmnetctl/vmnetctl/helperexec"
	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/procid"
	"github.com/vmnetctl/vmnetctl/spec"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// Launcher starts helpers, for the controller and for `vmnetctl run` alike.
type Launcher struct {
	StateDir        statedir.Dir
	Backend         backend.Backend
	Executable      string // vmnetctl itself
	VMNetHelperPath string // networks.yaml's paths.vmnetHelper
	StatsInterval   time.Duration
	StallTimeout    time.Duration
	StopGrace       time.Duration
	// Spares, if set, are relays started ahead of need, which take the
	// helpers they can (helperexec.StartOptions.Spares).
	Spares *helperexec.Spares
	// TapCountsRead: the caller reads the kernel's counters of a TAP a
	// VMM drives (`attach: tap`) itself, when asked for them (the
	// controller: backend.StatsQuery.Taps), so that the TAP's helper
	// counts nothing (no stats interval): idle, it never wakes.
	TapCountsRead bool
}

// CountedByCaller says whether a helper of attachment kind attach, whose
// command line is argv, counts nothing, its caller reading the counters
// of the TAP it holds (Launcher.TapCountsRead): one of `attach: tap`
// started with no stats interval. (From its command line: a controller
// tells so of a helper it adopted, and of one `vmnetctl run` started,
// which counts.)
func CountedByCaller(attach api.AttachKind, argv []string) bool {
	if attach != api.AttachTAP {
		return false
	}
	for i, arg := range argv {
		if arg == "--stats-interval" && i+1 < len(argv) {
			return argv[i+1] == "0"
		}
	}
	return false
}

// helperStart is one helper to start.
type HelperStart struct {
	Attachment *spec.Attachment
	Network    *api.Network
	Owner      *statedir.Project
	// fd is `vmnetctl run`'s end of a socketpair, the helper's descriptor
	// 3; nil for a helper that serves a socket or a TAP.
	fd *os.File
}

// helperTasks is about what a helper takes of the system's tasks (its
// relay's threads, the processes of its start), and taskReserve what Start
// leaves for the controller and the other starts under way: a Go program
// that cannot start a thread dies, and a controller started helpers until
// a full kernel.pid_max aborted it (pthread_create failed). A helper
// that finds less room fails with the limit named, and is retried.
const (
	helperTasks = 10
	taskReserve = 96
)

// InheritedFD is the number the helper knows a socketpair end by.
const InheritedFD = 3

// start starts the helper of s.a and waits until it is ready: its JSON line
// was written and, in socket mode, its socket exists. Its stdout and stderr
// go to files of the state dir, not pipes, so that it outlives a crash of
// the controller and can be adopted; helperexec puts it in its own process
// group, so signals to the controller's group do not reach VMs' cables.
func (l Launcher) Start(ctx context.Context, s HelperStart) (*helperexec.Helper, statedir.HelperRecord, error) {
	a := s.Attachment
	fail := func(err error) (*helperexec.Helper, statedir.HelperRecord, error) {
		return nil, statedir.HelperRecord{}, fmt.Errorf("helper for %s on network %s: %w", a.Key(), s.Network.ID, err)
	}
	if room, limit, ok := procid.TaskRoom(); ok && room < helperTasks+taskReserve {
		return fail(fmt.Errorf("no room for its process: %d more tasks may start (%s); a helper takes about %d, and %d are kept for the controller", room, limit, helperTasks, taskReserve))
	}
	if err := os.MkdirAll(l.StateDir.HelpersDir(), 0o750); err != nil {
		return fail(err)
	}
	if err := l.Backend.Cleanup(a.Attachment); err != nil {
		return fail(err)
	}
	interval := l.StatsInterval
	if l.TapCountsRead && a.Attach == api.AttachTAP {
		interval = 0
	}
	spec := backend.HelperSpec{Executable: l.Executable, Attachment: a.Attachment, Network: s.Network, UID: s.Owner.UID, GID: s.Owner.GID,
		FD: -1, NetworksFile: l.StateDir.NetworksYAML(), VMNetHelperPath: l.VMNetHelperPath, StatsInterval: interval,
		StatsFile: l.StateDir.HelperStatsFile(a.Key()), ShapingFile: l.StateDir.HelperShapingFile(a.Key()),
		LogFile: l.StateDir.HelperLogFile(a.Key()), Owner: l.StateDir.Path}
	switch {
	case s.fd != nil:
		spec.FD = InheritedFD
	case a.Attach != api.AttachTAP:
		sock, err := l.prepareSocket(a, s.Owner)
		if err != nil {
			return fail(err)
		}
		spec.Socket = sock
	}
	argv, err := l.Backend.HelperCommand(spec)
	if err != nil {
		return fail(err)
	}
	// Recorded before it runs: if this process dies before the helper's
	// record is saved, the next controller still knows whose it is
	// (KnownHelperPIDs).
	self, err := procid.Self()
	if err != nil {
		return fail(err)
	}
	if err := l.StateDir.SaveHelperIntent(statedir.HelperIntent{Key: a.Key(), Argv: argv, Starter: self}); err != nil {
		return fail(err)
	}
	env := HelperEnv(l.Backend.HelperEnv(spec))
	var cmd *exec.Cmd
	var setupLog []byte // what a helper set up here logged (PrepareHelper)
	var afterExit, started func()
	if p, ok := l.Backend.(backend.HelperPreparer); ok && s.fd == nil {
		prep, err := p.PrepareHelper(argv, spec)
		if err != nil {
			return fail(err)
		}
		if prep != nil {
			defer prep.Release() // (if it did not start; twice does nothing)
			cmd, setupLog, afterExit, started = prep.Cmd, prep.Log, prep.AfterExit, prep.Release
			cmd.Env = append(env, cmd.Env...)
		}
	}
	if cmd == nil {
		cmd = Command(l.Backend, argv)
		cmd.Env = env
		if s.fd != nil {
			cmd.ExtraFiles = []*os.File{s.fd}
		}
	}
	proc, err := helperexec.Start(ctx, cmd, helperexec.StartOptions{SocketPath: spec.Socket, StallTimeout: l.StallTimeout,
		StopGrace: l.StopGrace, ReadyFile: l.StateDir.HelperReadyFile(a.Key()), LogFile: spec.LogFile,
		LogFirst: setupLog, AfterExit: afterExit, Started: started, Spares: l.Spares})
	if err != nil {
		return fail(err)
	}
	id, err := procid.Read(proc.Pid())
	if err != nil {
		proc.Stop()
		return fail(err)
	}
	ready, _ := proc.Ready.MarshalJSON()
	rec := NewHelperRecord(a, 0)
	rec.Proc, rec.Socket, rec.Tap, rec.TapIndex, rec.Ready, rec.StartedAt = id, spec.Socket, proc.Ready.TapName, proc.Ready.TapIndex, string(ready), time.Now()
	return proc, rec, nil
}

// prepareSocket makes the VM's folder of the state dir ready for the
// helper's socket, and returns the socket's path. The helper creates its
// socket there after dropping to the VM's owner, and the owner's VMM binds
// its own beside it: the owner must be able to pass through the state dir
// and vms/ (not list them: mode 0711).
func (l Launcher) prepareSocket(a *spec.Attachment, owner *statedir.Project) (string, error) {
	vmDir := l.StateDir.VMDir(a.VM)
	if err := os.MkdirAll(vmDir, 0o750); err != nil {
		return "", err
	}
	if owner.UID >= 0 {
		for _, d := range []string{l.StateDir.Path, l.StateDir.VMsDir()} {
			if err := os.Chmod(d, 0o711); err != nil {
				return "", err
			}
		}
		if err := os.Chown(vmDir, owner.UID, owner.GID); err != nil {
			return "", fmt.Errorf("giving %s to uid %d: %w", vmDir, owner.UID, err)
		}
	}
	sock := l.StateDir.SocketPath(a.VM, a.Index)
	// A helper that was killed leaves its socket and lock behind.
	RemoveSocket(sock)
	return sock, nil
}

// RemoveSocket removes a helper's socket and its lock (helperproto.SocketLock).
func RemoveSocket(sock string) {
	os.Remove(sock)
	os.Remove(helperproto.SocketLock(sock))
}

// NewHelperRecord is the record of attachment a's helper, before it runs.
func NewHelperRecord(a *spec.Attachment, restarts int) statedir.HelperRecord {
	return statedir.HelperRecord{Key: a.Key(), VM: a.VM, Index: a.Index, Network: a.Network, Project: a.Project,
		MAC: a.MAC, Attach: a.Attach, Restarts: restarts}
}

// Command is the command that runs a helper's command line argv for
// backend b: the program b runs it with (backend.HelperProgrammer), and
// argv as the process's command line.
func Command(b backend.Backend, argv []string) *exec.Cmd {
	cmd := exec.Command(argv[0], argv[1:]...)
	if p, ok := b.(backend.HelperProgrammer); ok {
		if prog := p.HelperProgram(argv[0]); prog != argv[0] {
			cmd.Path, cmd.Err = prog, nil
		}
	}
	return cmd
}

// HelperEnv is the controller's environment without sudo's variables, plus
// what the backend gives its helper (vmnet-helper takes the VM's owner as
// $SUDO_UID and $SUDO_GID).
func HelperEnv(extra []string) []string {
	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "SUDO_") {
			env = append(env, e)
		}
	}
	return append(env, extra...)
}

// The helpers' defaults, for the controller's and `vmnetctl run`'s alike.
const (
	DefaultStatsInterval = 5 * time.Second
	DefaultStallTimeout  = helperexec.DefaultStallTimeout
	DefaultStopGrace     = 5 * time.Second
)
