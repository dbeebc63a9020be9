package controller

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/backend"
	"github.com/vmnetctl/vmnetctl/helperexec"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// FirstVMFD is the descriptor number of the VM's first attachment in the
// command `vmnetctl run` starts; the next attachment has the next number.
// Descriptor 3 is left to /dev/null, as in vmnet-helper's vmnet-run, where
// it is the helper's.
const FirstVMFD = 4

// RunOptions configure RunVM.
type RunOptions struct {
	Executable     string
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	ReadyTimeout   time.Duration
	StopGrace      time.Duration
	StatsInterval  time.Duration
	// OnReady is called once every helper is ready, before the command starts.
	OnReady func()
	// Backend builds the helpers' command lines (default: the platform's).
	Backend backend.Backend
	// VMNetHelperPath is networks.yaml's paths.vmnetHelper.
	VMNetHelperPath string
}

// Socket buffer sizes of a socketpair, as vmnet-helper's vmnet-run sets them.
const (
	socketpairSndBuf = 65 << 10
	socketpairRcvBuf = 4 << 20
)

// RunVM is `vmnetctl run`: one socketpair per attachment of the VM, a
// helper on one end of each (--fd), and command on the others (descriptors
// 4, 5, ...), supervised as one unit: when the command exits the helpers
// stop. It returns the command's exit status. The project must be saved and
// its networks (nets, by ID) up. Under sudo the command runs as the invoking user.
func RunVM(ctx context.Context, sd statedir.Dir, p *statedir.Project, atts []*Attachment, nets map[string]*api.Network, command []string, o RunOptions) (int, error) {
	if len(command) == 0 {
		return 0, errors.New("no command to run (vmnetctl run ... -- COMMAND)")
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 15 * time.Second
	}
	if o.StopGrace == 0 {
		o.StopGrace = 5 * time.Second
	}
	if o.StatsInterval == 0 {
		o.StatsInterval = 5 * time.Second
	}
	if o.Backend == nil {
		o.Backend = DefaultBackend()
	}
	var helpers []*helperexec.Helper
	var recs []statedir.HelperRecord
	var vmEnds []*os.File
	stopAll := func() {
		var wg sync.WaitGroup
		for _, h := range helpers {
			wg.Go(func() { h.Stop() })
		}
		wg.Wait()
		sd.RemoveRunHelpers(p.Name)
	}
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			f.Close()
		}
	}
	for _, a := range atts {
		helperEnd, vmEnd, err := socketpair()
		if err != nil {
			closeAll(vmEnds)
			stopAll()
			return 0, err
		}
		vmEnds = append(vmEnds, vmEnd)
		h, rec, err := startFDHelper(ctx, sd, a, nets[a.Network], p, helperEnd, o)
		helperEnd.Close() // the helper has it now
		if err != nil {
			closeAll(vmEnds)
			stopAll()
			return 0, err
		}
		helpers = append(helpers, h)
		recs = append(recs, rec)
	}
	if err := sd.SaveRunHelpers(p.Name, recs); err != nil {
		closeAll(vmEnds)
		stopAll()
		return 0, err
	}
	if o.OnReady != nil {
		o.OnReady()
	}

	devnull, err := os.Open(os.DevNull)
	if err != nil {
		closeAll(vmEnds)
		stopAll()
		return 0, err
	}
	cmd := exec.Command(command[0], command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = o.Stdin, o.Stdout, o.Stderr
	cmd.ExtraFiles = append([]*os.File{devnull}, vmEnds...)
	var fds, macs []string
	for i, a := range atts {
		fds = append(fds, strconv.Itoa(FirstVMFD+i))
		macs = append(macs, a.MAC)
	}
	cmd.Env = append(os.Environ(), "VMNETCTL_FDS="+strings.Join(fds, ","), "VMNETCTL_MACS="+strings.Join(macs, ","))
	if uid, gid := os.Getenv("SUDO_UID"), os.Getenv("SUDO_GID"); os.Geteuid() == 0 && uid != "" && gid != "" {
		u, _ := strconv.Atoi(uid)
		g, _ := strconv.Atoi(gid)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(u), Gid: uint32(g)}}
	}
	err = cmd.Start()
	devnull.Close()
	closeAll(vmEnds) // the command has them; the helpers see it go when it exits
	if err != nil {
		stopAll()
		return 0, fmt.Errorf("starting %s: %w", command[0], err)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	var werr error
loop:
	for {
		select {
		case s := <-sigs:
			cmd.Process.Signal(s)
		case werr = <-waited:
			break loop
		}
	}
	stopAll()
	var ee *exec.ExitError
	switch {
	case werr == nil:
		return 0, nil
	case errors.As(werr, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal()), nil
		}
		return ee.ExitCode(), nil
	default:
		return 0, werr
	}
}

func socketpair() (helperEnd, vmEnd *os.File, err error) {
	syscall.ForkLock.RLock() // no fork between socketpair and close-on-exec
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_DGRAM, 0)
	if err == nil {
		syscall.CloseOnExec(fds[0])
		syscall.CloseOnExec(fds[1])
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	for _, fd := range fds {
		syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_SNDBUF, socketpairSndBuf)
		syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_RCVBUF, socketpairRcvBuf)
	}
	return os.NewFile(uintptr(fds[0]), "helper-end"), os.NewFile(uintptr(fds[1]), "vm-end"), nil
}

// startFDHelper starts a helper on an inherited socketpair end and waits for
// its JSON line. Its output goes where the controller's helpers' goes, so the
// controller reads its stats the same way.
func startFDHelper(ctx context.Context, sd statedir.Dir, a *Attachment, n *api.Network, p *statedir.Project, end *os.File, o RunOptions) (*helperexec.Helper, statedir.HelperRecord, error) {
	if err := os.MkdirAll(sd.HelpersDir(), 0o750); err != nil {
		return nil, statedir.HelperRecord{}, err
	}
	argv, err := o.Backend.HelperCommand(backend.HelperSpec{Executable: o.Executable, Attachment: a.Attachment, Network: n, UID: p.UID, GID: p.GID,
		FD: 3, NetworksFile: sd.NetworksYAML(), VMNetHelperPath: o.VMNetHelperPath, StatsInterval: o.StatsInterval})
	if err != nil {
		return nil, statedir.HelperRecord{}, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.ExtraFiles = []*os.File{end}
	cmd.Env = helperEnv(p)
	h, err := helperexec.Start(ctx, cmd, helperexec.StartOptions{ReadyTimeout: o.ReadyTimeout, StopGrace: o.StopGrace,
		ReadyFile: sd.HelperReadyFile(a.Key()), LogFile: sd.HelperLogFile(a.Key())})
	if err != nil {
		return nil, statedir.HelperRecord{}, fmt.Errorf("helper for %s on network %s: %w", a.Key(), a.Network, err)
	}
	id, err := helperexec.ReadProcIdentity(h.Pid())
	if err != nil {
		h.Stop()
		return nil, statedir.HelperRecord{}, err
	}
	ready, _ := h.Ready.MarshalJSON()
	return h, statedir.HelperRecord{Key: a.Key(), VM: a.VM, Index: a.Index, Network: a.Network, Project: a.Project, MAC: a.MAC,
		Attach: a.Attach, Proc: id, Tap: h.Ready.TapName, Ready: string(ready), StartedAt: time.Now()}, nil
}
