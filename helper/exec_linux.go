package helper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	gosignal "os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/guard"
	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/relay"
)

// setupSocket opens the VM's socket: the inherited --fd, or the --socket
// path, created and locked (the listener; nil with --fd). It returns the
// relay's spec with it.
func (s *session) setupSocket() (relay.Spec, *relay.Listener, error) {
	spec := s.relaySpec()
	if s.o.SocketPath == "" {
		return spec, nil, nil
	}
	listen := relay.Listen
	if spec.Stream {
		listen = relay.ListenStream
	}
	lis, err := listen(s.o.SocketPath)
	if err != nil {
		return spec, nil, err
	}
	if err := helperproto.SetSocketBuffers(lis.FD(), s.o.Offloads()); err != nil {
		s.log.Warnf("main", "--socket %s: %v", s.o.SocketPath, err)
	}
	spec.Socket, spec.SocketPath, spec.LockFD = lis.FD(), s.o.SocketPath, lis.LockFD()
	return spec, lis, nil
}

// relaySpec is the relay's spec for this helper, but for its socket.
func (s *session) relaySpec() relay.Spec {
	spec := relay.Spec{TAP: s.port.FD, TapName: s.tapName, Socket: s.o.FD, StatsInterval: s.o.StatsInterval, Verbose: s.o.Verbose, LogTimestamps: s.o.LogTimestamps}
	if s.stats.File != nil {
		spec.StatsFD = int(s.stats.File.Fd())
	}
	if s.shaping != nil {
		spec.ShapingFD = int(s.shaping.Fd())
	}
	if s.o.Offloads() {
		spec.Hdr = VirtioNetHdrLen
	}
	spec.Frame = spec.Hdr + s.ready.MaxPacketSize
	if s.relayOffloads {
		spec.TapHdr = VirtioNetHdrLen
	}
	spec.Stream = s.o.Attach == AttachStream
	return spec
}

// holdSpec is the relay's spec for a helper of `attach: tap`: it holds
// the TAP, which the VMM opens by name, and moves no frames (relay.Hold).
func (s *session) holdSpec() relay.Spec {
	spec := relay.Spec{Hold: true, TAP: -1, Socket: -1, TapName: s.tapName, TapIndex: int(s.port.Index),
		StatsInterval: s.o.StatsInterval, Verbose: s.o.Verbose, LogTimestamps: s.o.LogTimestamps}
	if s.stats.File != nil {
		spec.StatsFD = int(s.stats.File.Fd())
	}
	return spec
}

// learns says whether the port's guard learns the VM's MAC (no --mac), so
// that a restarted VMM's MAC must be learned anew.
func (s *session) learns() bool { return s.o.VMMAC == nil && !s.o.NoSpoofCheck }

// relearn is the in-process Relearn hook: the guard forgets the MAC it
// learned. nil for a port that does not learn.
func (s *session) relearn() func() error {
	if !s.learns() {
		return nil
	}
	return func() error { return guard.AddPort(context.Background(), s.o.Network, s.tapName, nil) }
}

// relearnMAC is `vmnetctl helper ... --tap NAME --relearn-mac`: the
// port's guard forgets the MAC it learned. It is vmnetctl-relay's, which
// runs it as root (Main refuses it through sudo), and only for a port that
// learns (no --mac, and guarded).
func relearnMAC(ctx context.Context, o Options) error {
	if o.TapName == "" {
		return fmt.Errorf("--%s needs --tap", RelearnFlag)
	}
	if o.VMMAC != nil || o.NoSpoofCheck {
		return fmt.Errorf("--%s: port %s does not learn its MAC (--mac or --no-spoof-check)", RelearnFlag, o.TapName)
	}
	return guard.AddPort(ctx, o.Network, o.TapName, nil)
}

// errNoExec says why the helper relays in its own process.
var errNoExec = errors.New("")

// execRelay replaces the helper, set up, by vmnetctl-relay (relay.Binary,
// next to this executable) with the same command line, so that the
// process keeps its identity (pid, start time, arguments: what the
// controller knows it by) and its descriptors, and sheds the memory of
// everything else vmnetctl links. It returns only when it did not exec,
// saying why: no such binary, one it does not trust, or a log that is not
// stderr. The cleanup pipe of a macvtap or a persistent TAP goes along
// (Spec.Keep): its child deletes the port once the relay is gone.
//
// Signals: SIGTERM and SIGINT end the process (and its port with it)
// from just before the exec until vmnetctl-relay catches them again, first
// thing, before it prints the ready line: whoever waits for that line
// stops a relay that catches them. One that came earlier is in ctx, and
// the helper then does not exec, except one caught by Go in the moment
// before the reset and not yet passed on to ctx: that one is lost, and the
// relay runs until whoever stops it escalates to SIGKILL (the controller
// does after its grace), which ends it with its port. If the exec fails,
// SIGTERM and SIGINT call stop again.
func (s *session) execRelay(ctx context.Context, stop context.CancelFunc, spec relay.Spec) error {
	if s.o.Stderr != os.Stderr {
		return fmt.Errorf("%w(the log is not stderr)", errNoExec)
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	bin := filepath.Join(filepath.Dir(exe), relay.Binary)
	if err := trustedBeside(bin, exe, os.Geteuid()); err != nil {
		return err
	}
	if fd := s.port.CleanupFD(); fd >= 0 {
		// The cleanup child of a macvtap or a persistent TAP deletes it
		// once the relay is gone.
		spec.Keep, spec.CleanupPID = append(spec.Keep, fd), s.port.CleanupPID()
	}
	if s.learns() && !spec.Hold && os.Geteuid() == 0 && !throughSudo() {
		// Only a relay that is still root may change the guard (as the
		// helper itself: one running as the VM's owner keeps the MAC).
		spec.Relearn = append(append([]string{exe}, os.Args[1:]...), "--tap", s.tapName, "--"+RelearnFlag)
	}
	ready, err := json.Marshal(s.ready)
	if err != nil {
		return err
	}
	spec.Ready = string(ready)
	env, err := spec.Encode()
	if err != nil {
		return err
	}
	if err := spec.Inheritable(); err != nil {
		return err
	}
	s.log.Debugf("main", "handing the relay to %s", bin)
	// From here a SIGTERM ends the process at once (the port goes with
	// its fd) rather than being caught by a process about to be replaced.
	gosignal.Reset(syscall.SIGTERM, syscall.SIGINT)
	if ctx.Err() != nil {
		return fmt.Errorf("%w(stopping)", errNoExec)
	}
	// The shaping signal stays ignored across the exec (SIG_IGN is kept),
	// until vmnetctl-relay's runtime catches it: one sent in between is
	// lost, not fatal (the relay reads the file once it listens).
	gosignal.Ignore(helperproto.ShapingSignal)
	err = syscall.Exec(bin, os.Args, handOverEnv(env))
	gosignal.Reset(helperproto.ShapingSignal)
	// Not replaced: catch the signals again, and let them stop the
	// relay, as Main's did.
	sig := make(chan os.Signal, 1)
	gosignal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		select {
		case <-sig:
			stop()
		case <-ctx.Done():
		}
	}()
	return fmt.Errorf("exec %s: %w", bin, err)
}

// Program is the program that runs a `vmnetctl helper` command line whose
// first word is exe, for the controller: vmnetctl-helper (Binary) beside
// exe, when it is there and trusted as execRelay trusts vmnetctl-relay,
// else exe itself. Either way the process shows the helper's command line
// and execs vmnetctl-relay once set up; vmnetctl-helper links the helper
// only, and starts in a fraction of vmnetctl's time: at a fleet's `up`,
// starting processes is most of the machine's work.
func Program(exe string) string {
	bin := filepath.Join(filepath.Dir(exe), Binary)
	if trustedBeside(bin, exe, os.Geteuid()) != nil {
		return exe
	}
	return bin
}

// handOverEnv is the helper's environment with EnvSpec set to spec, and
// any EnvSpec it inherited removed: the first of two would win, and the
// spec names the command run to relearn a MAC; and the relay's IdleEnv in
// place of any GOMAXPROCS.
func handOverEnv(spec string) []string {
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, relay.EnvSpec+"=") || strings.HasPrefix(kv, "GOMAXPROCS=")
	})
	return append(env, relay.EnvSpec+"="+spec, relay.IdleEnv)
}

// trustedBeside checks that the helper may exec bin, a program of
// vmnetctl's beside exe (vmnetctl-relay; Program's vmnetctl-helper): it exists and the
// current user may run it; for a helper that dropped to the VM's owner,
// that user cannot read it (mode 0711: the kernel then keeps the process
// undumpable across the exec, as it made it at the setuid, so the VM's
// owner cannot trace it and use its descriptors); for a helper still root,
// it is owned by root or by exe's owner and writable by nobody else.
func trustedBeside(bin, exe string, euid int) error {
	var st, est unix.Stat_t
	if err := unix.Stat(bin, &st); err != nil {
		return fmt.Errorf("%w(no %s next to %s)", errNoExec, filepath.Base(bin), exe)
	}
	if err := unix.Access(bin, unix.X_OK); err != nil {
		return fmt.Errorf("%s: %w", bin, err)
	}
	if euid != 0 {
		if unix.Access(bin, unix.R_OK) == nil {
			return fmt.Errorf("%s is readable by uid %d, which could then trace the process: install it with mode 0711", bin, euid)
		}
		return nil
	}
	if err := unix.Stat(exe, &est); err != nil {
		return err
	}
	if st.Uid != 0 && st.Uid != est.Uid {
		return fmt.Errorf("%s is owned by uid %d, not root nor %s's owner", bin, st.Uid, exe)
	}
	if st.Mode&0o022 != 0 {
		return fmt.Errorf("%s is writable by group or others", bin)
	}
	return nil
}
