package controller

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/backend"
	"github.com/vmnetctl/vmnetctl/helperexec"
	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/procid"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// launcher starts helpers, for the controller and for `vmnetctl run` alike.
type launcher struct {
	sd              statedir.Dir
	be              backend.Backend
	exe             string // vmnetctl itself
	vmnetHelperPath string // networks.yaml's paths.vmnetHelper
	statsInterval   time.Duration
	stallTimeout    time.Duration
	stopGrace       time.Duration
}

// helperStart is one helper to start.
type helperStart struct {
	a     *Attachment
	n     *api.Network
	owner *statedir.Project
	// fd is `vmnetctl run`'s end of a socketpair, the helper's descriptor
	// 3; nil for a helper that serves a socket or a TAP.
	fd *os.File
}

// inheritedFD is the number the helper knows a socketpair end by.
const inheritedFD = 3

// start starts the helper of s.a and waits until it is ready: its JSON line
// was written and, in socket mode, its socket exists. Its stdout and stderr
// go to files of the state dir, not pipes, so that it outlives a crash of
// the controller and can be adopted; helperexec puts it in its own process
// group, so signals to the controller's group do not reach VMs' cables.
func (l launcher) start(ctx context.Context, s helperStart) (*helperexec.Helper, statedir.HelperRecord, error) {
	a := s.a
	fail := func(err error) (*helperexec.Helper, statedir.HelperRecord, error) {
		return nil, statedir.HelperRecord{}, fmt.Errorf("helper for %s on network %s: %w", a.Key(), s.n.ID, err)
	}
	if err := os.MkdirAll(l.sd.HelpersDir(), 0o750); err != nil {
		return fail(err)
	}
	if err := l.be.Cleanup(a.Attachment); err != nil {
		return fail(err)
	}
	spec := backend.HelperSpec{Executable: l.exe, Attachment: a.Attachment, Network: s.n, UID: s.owner.UID, GID: s.owner.GID,
		FD: -1, NetworksFile: l.sd.NetworksYAML(), VMNetHelperPath: l.vmnetHelperPath, StatsInterval: l.statsInterval,
		StatsFile: l.sd.HelperStatsFile(a.Key()), Owner: l.sd.Path}
	switch {
	case s.fd != nil:
		spec.FD = inheritedFD
	case a.Attach != api.AttachTAP:
		sock, err := l.prepareSocket(a, s.owner)
		if err != nil {
			return fail(err)
		}
		spec.Socket = sock
	}
	argv, err := l.be.HelperCommand(spec)
	if err != nil {
		return fail(err)
	}
	// Recorded before it runs: if this process dies before the helper's
	// record is saved, the next controller still knows whose it is
	// (knownHelperPIDs).
	self, err := procid.Read(os.Getpid())
	if err != nil {
		return fail(err)
	}
	if err := l.sd.SaveHelperIntent(statedir.HelperIntent{Key: a.Key(), Argv: argv, Starter: self}); err != nil {
		return fail(err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = helperEnv(l.be.HelperEnv(spec))
	if s.fd != nil {
		cmd.ExtraFiles = []*os.File{s.fd}
	}
	proc, err := helperexec.Start(ctx, cmd, helperexec.StartOptions{SocketPath: spec.Socket, StallTimeout: l.stallTimeout,
		StopGrace: l.stopGrace, ReadyFile: l.sd.HelperReadyFile(a.Key()), LogFile: l.sd.HelperLogFile(a.Key())})
	if err != nil {
		return fail(err)
	}
	id, err := procid.Read(proc.Pid())
	if err != nil {
		proc.Stop()
		return fail(err)
	}
	ready, _ := proc.Ready.MarshalJSON()
	rec := newHelperRecord(a, 0)
	rec.Proc, rec.Socket, rec.Tap, rec.Ready, rec.StartedAt = id, spec.Socket, proc.Ready.TapName, string(ready), time.Now()
	return proc, rec, nil
}

// prepareSocket makes the VM's folder of the state dir ready for the
// helper's socket, and returns the socket's path. The helper creates its
// socket there after dropping to the VM's owner, and the owner's VMM binds
// its own beside it: the owner must be able to pass through the state dir
// and vms/ (not list them: mode 0711).
func (l launcher) prepareSocket(a *Attachment, owner *statedir.Project) (string, error) {
	vmDir := l.sd.VMDir(a.VM)
	if err := os.MkdirAll(vmDir, 0o750); err != nil {
		return "", err
	}
	if owner.UID >= 0 {
		for _, d := range []string{l.sd.Path, l.sd.VMsDir()} {
			if err := os.Chmod(d, 0o711); err != nil {
				return "", err
			}
		}
		if err := os.Chown(vmDir, owner.UID, owner.GID); err != nil {
			return "", fmt.Errorf("giving %s to uid %d: %w", vmDir, owner.UID, err)
		}
	}
	sock := l.sd.SocketPath(a.VM, a.Index)
	// A helper that was killed leaves its socket and lock behind.
	removeSocket(sock)
	return sock, nil
}

// removeSocket removes a helper's socket and its lock (helperproto.SocketLock).
func removeSocket(sock string) {
	os.Remove(sock)
	os.Remove(helperproto.SocketLock(sock))
}

// newHelperRecord is the record of attachment a's helper, before it runs.
func newHelperRecord(a *Attachment, restarts int) statedir.HelperRecord {
	return statedir.HelperRecord{Key: a.Key(), VM: a.VM, Index: a.Index, Network: a.Network, Project: a.Project,
		MAC: a.MAC, Attach: a.Attach, Restarts: restarts}
}
