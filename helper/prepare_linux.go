package helper

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/netplane"
	"github.com/vmnetctl/vmnetctl/relay"
)

// Prepared is a helper that Prepare set up in the calling process: the
// command that runs vmnetctl-relay as that helper, and what it holds of
// the port and the socket until that command started.
type Prepared struct {
	// Cmd runs vmnetctl-relay with the helper's command line, as the VM's
	// owner, with the port, the socket and the files as its descriptors.
	// Its Env holds the relay's spec only: the caller adds the rest.
	Cmd *exec.Cmd
	// Log is what the helper logged while it was set up, for its log.
	Log []byte

	port  *netplane.Port
	held  *netplane.HeldPort // a copy of the port's fd, for after the relay (AfterExit)
	lis   *relay.Listener
	files []*os.File // Cmd's ExtraFiles, and the stats and shaping files
}

// AfterExit is what the caller calls once the relay has exited, however
// it ended, or did not start (helperexec.StartOptions.AfterExit): it
// closes this process's copy of the VM's TAP, its last, and the TAP goes
// then, without the relay's exit waiting for the kernel to delete it
// (netplane.HeldPort). nil when this process kept none.
func (p *Prepared) AfterExit() func() {
	if p.held == nil {
		return nil
	}
	return p.held.Release
}

// Prepare runs, in this process, the steps of the helper whose command
// line is argv (backend/linuxnet.HelperCommand) on network n, up to the
// relay, as Run does them: it checks the options, opens the stats and
// shaping files, makes the VM's port and, with the VM's owner's file
// system ids (on a thread of its own), the socket; it returns the command
// that runs vmnetctl-relay with them, as the VM's owner, under argv as its
// command line, by which the controller knows a helper. One process start
// an attachment, the small relay's, instead of the helper's and then the
// relay's: at a fleet's `up`, starting processes is most of the work.
//
// A helper of `attach: tap` is set up the same way: its persistent TAP
// made here and given to this process's link reaper (relay.Reap, one
// vmnetctl-relay for every such TAP, which logs to this process's
// stderr), and the relay then only holds it (relay.Hold), with its end of
// the pipe the reaper watches.
//
// It returns nil, nil for a helper it does not set up, which the caller
// runs as argv says: one with neither --socket nor --attach tap (an
// inherited --fd, vhost-user), one whose port would be a macvtap, or one
// without a vmnetctl-relay beside argv[0] that the VM's owner may run and
// not read (trustedFor). Call Release once Cmd started, or failed to.
func Prepare(argv []string, n *api.Network) (*Prepared, error) {
	if len(argv) < 2 {
		return nil, nil
	}
	f, err := parseCommandLine(argv[1:], true)
	if err != nil {
		return nil, err
	}
	tap := f.Attach == AttachTap
	switch {
	case f.DeleteLink != "", f.Relearn, f.PrintVersion, f.ListSharedInterfaces, f.FD >= 0, f.Socket == "" && !tap:
		return nil, nil
	case f.Attach != AttachRelay && f.Attach != AttachStream && !tap:
		return nil, nil
	case f.Network != n.ID:
		return nil, fmt.Errorf("helper command line for network %q, not %q", f.Network, n.ID)
	}
	if n.Mode == api.ModeBridged {
		// (Only a bridged network's VMs may get a macvtap.)
		if _, err := netplane.NetworkBridge(n); errors.Is(err, netplane.ErrMacvtapPort) {
			return nil, nil
		}
	}
	if err := f.check(); err != nil {
		return nil, err
	}
	bin := filepath.Join(filepath.Dir(argv[0]), relay.Binary)
	var log bytes.Buffer
	o := f.optionsFor(n, Streams{Out: io.Discard, Err: &log})
	uid, _, err := owner(o.UID, o.GID)
	if err != nil {
		return nil, err
	}
	if trustedFor(bin, argv[0], uid) != nil {
		return nil, nil
	}
	s, err := checkOptions(&o, bin+", set up by the controller (pid "+fmt.Sprint(os.Getpid())+")")
	if err != nil {
		return nil, err
	}
	// The controller's helper is not one run through sudo, whatever the
	// controller's environment says (launch.HelperEnv removes sudo's
	// variables for the helpers it runs).
	s.underController = true
	p := &Prepared{}
	done := false
	defer func() {
		if !done {
			p.close(true)
		}
	}()
	if tap {
		s.watch = func(index uint32) (*os.File, *os.File, error) {
			return reaperFor(bin, hostnet.Owner()).watch(relay.ReapEntry{Index: int(index), Name: s.tapName, Mark: hostnet.TapMark(s.tapName)})
		}
	}
	if err := s.openStats(); err != nil {
		return nil, err
	}
	if s.stats.File != nil {
		p.files = append(p.files, s.stats.File)
	}
	if err := s.openShaping(); err != nil {
		return nil, err
	}
	if s.shaping != nil {
		p.files = append(p.files, s.shaping)
	}
	if err := s.createPort(); err != nil {
		return nil, err
	}
	p.port = s.port
	// The relay's descriptors, as it will number them (ExtraFiles: 3 on).
	var extra []*os.File
	pass := func(fd int, name string) (int, error) {
		dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return -1, fmt.Errorf("%s: %w", name, err)
		}
		f := os.NewFile(uintptr(dup), name)
		p.files = append(p.files, f)
		extra = append(extra, f)
		return 3 + len(extra) - 1, nil
	}
	var spec relay.Spec
	if tap {
		// The VMM opens the TAP by name: the relay holds the pipe the
		// link reaper watches, and reads the one it tells on.
		s.port.CloseFD()
		spec = s.holdSpec()
		keep, err := pass(s.port.CleanupFD(), "cleanup of "+s.tapName)
		if err != nil {
			return nil, err
		}
		spec.Keep = []int{keep}
		if spec.CleanupDone, err = pass(s.port.CleanupDoneFD(), "cleanup of "+s.tapName+" done"); err != nil {
			return nil, err
		}
	} else {
		p.held = s.port.Hold()
		spec = s.relaySpec()
		if p.lis, err = listenAs(o.SocketPath, spec.Stream, s.uid, s.gid); err != nil {
			return nil, err
		}
		if err := helperproto.SetSocketBuffers(p.lis.FD(), o.Offloads()); err != nil {
			s.log.Warnf("main", "--socket %s: %v", o.SocketPath, err)
		}
		if spec.TAP, err = pass(s.port.FD, s.tapName); err != nil {
			return nil, err
		}
		if spec.Socket, err = pass(p.lis.FD(), o.SocketPath); err != nil {
			return nil, err
		}
		if spec.LockFD, err = pass(p.lis.LockFD(), helperproto.SocketLock(o.SocketPath)); err != nil {
			return nil, err
		}
		spec.SocketPath = o.SocketPath
	}
	if s.stats.File != nil {
		if spec.StatsFD, err = pass(int(s.stats.File.Fd()), o.StatsFile); err != nil {
			return nil, err
		}
	}
	if s.shaping != nil {
		if spec.ShapingFD, err = pass(int(s.shaping.Fd()), o.ShapingFile); err != nil {
			return nil, err
		}
	}
	if s.learns() && !tap && s.uid <= 0 {
		// A relay that stays root may change the guard (as the helper's).
		spec.Relearn = append(append([]string{argv[0]}, argv[1:]...), "--tap", s.tapName, "--"+RelearnFlag)
	}
	ready, err := json.Marshal(s.ready)
	if err != nil {
		return nil, err
	}
	spec.Ready = string(ready)
	env, err := spec.Encode()
	if err != nil {
		return nil, err
	}
	p.Cmd = &exec.Cmd{Path: bin, Args: argv, ExtraFiles: extra, Env: []string{relay.EnvSpec + "=" + env, relay.IdleEnv}}
	if s.uid >= 0 || s.gid >= 0 {
		// Dropped in the child before the exec: from the setuid on, the
		// kernel keeps it undumpable (vmnetctl-relay is not readable by
		// the VM's owner: trustedFor), as the helper's own drop does.
		cred := &syscall.Credential{Uid: uint32(os.Geteuid()), Gid: uint32(os.Getegid())}
		if s.uid >= 0 {
			cred.Uid = uint32(s.uid)
		}
		if s.gid >= 0 {
			cred.Gid = uint32(s.gid)
			for _, g := range ownerGroups(s.uid, s.gid) {
				cred.Groups = append(cred.Groups, uint32(g))
			}
		}
		p.Cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		s.log.Infof("main", "the relay runs as uid: %d gid: %d", cred.Uid, cred.Gid)
	}
	p.Log = log.Bytes()
	done = true
	return p, nil
}

// Release closes this process's descriptors of the port, the socket and
// the files, once Cmd started (the relay holds its own) or failed to (the
// port goes with the last of them, and the socket stays for the next
// helper to replace). It does not wait for a persistent TAP's deletion
// (netplane.Port.Disown): the relay that holds the TAP does.
func (p *Prepared) Release() { p.close(false) }

// close closes what p holds; undo also removes the socket.
func (p *Prepared) close(undo bool) {
	for _, f := range p.files {
		f.Close()
	}
	p.files = nil
	if p.lis != nil {
		if undo {
			p.lis.Close()
		} else {
			p.lis.Release()
		}
		p.lis = nil
	}
	if p.port != nil {
		if undo {
			p.port.Close()
		} else {
			p.port.Disown()
		}
		p.port = nil
	}
	if undo && p.held != nil {
		p.held.Release()
		p.held = nil
	}
}

// listenAs creates the helper's socket at path as user uid and group gid
// (-1: this process's) would: on a thread of its own whose file system ids
// are theirs, so that the socket and its lock are theirs and every path is
// looked up with their rights (the VM's folder is theirs), as the helper
// does once it dropped its privileges. The thread is not used again: it
// ends with its goroutine. With neither id to take, it makes them here.
func listenAs(path string, stream bool, uid, gid int) (*relay.Listener, error) {
	if uid < 0 && gid < 0 {
		return relay.ListenShared(path, stream)
	}
	type result struct {
		lis *relay.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread goes with the goroutine
		if gid >= 0 {
			unix.Setfsgid(gid)
			if got, _ := unix.SetfsgidRetGid(-1); got != gid {
				ch <- result{err: fmt.Errorf("--socket %s: setfsgid %d: still %d", path, gid, got)}
				return
			}
		}
		if uid >= 0 {
			unix.Setfsuid(uid)
			if got, _ := unix.SetfsuidRetUid(-1); got != uid {
				ch <- result{err: fmt.Errorf("--socket %s: setfsuid %d: still %d", path, uid, got)}
				return
			}
		}
		lis, err := relay.ListenShared(path, stream)
		ch <- result{lis, err}
	}()
	r := <-ch
	return r.lis, r.err
}

// trustedFor checks that a relay run as uid (0 or -1: root) may run bin, beside
// exe: as trustedBeside trusts it for root; for another user, also owned
// by someone else and readable by neither group nor others, so that the
// kernel keeps the relay undumpable across the exec.
func trustedFor(bin, exe string, uid int) error {
	if err := trustedBeside(bin, exe, 0); err != nil {
		return err
	}
	if uid <= 0 {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Stat(bin, &st); err != nil {
		return err
	}
	if int(st.Uid) == uid || st.Mode&0o044 != 0 {
		return fmt.Errorf("%s could be read by uid %d: install it with mode 0711, owned by root", bin, uid)
	}
	return nil
}
