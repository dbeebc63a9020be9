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

	"github.com/vmnetctl/vmnetctl/helperexec"
	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// FirstVMFD is the descriptor number of the VM's first attachment in the
// command `vmnetctl run` starts; the next attachment has the next number.
// Descriptor 3 is left to /dev/null, as in vmnet-helper's vmnet-run, where
// it is the helper's.
const FirstVMFD = 4

// Socket buffer sizes of a socketpair, as vmnet-helper's vmnet-run sets them.
const (
	socketpairSndBuf = 65 << 10
	socketpairRcvBuf = 4 << 20
)

// vmCommand is what `vmnetctl run` runs: the VM's attachments, each on a
// socketpair with a helper on the other end, and the VMM's command line.
type vmCommand struct {
	project *statedir.Project
	atts    []*Attachment
	command []string
	stdin   io.Reader
	stdout  io.Writer
	stderr  io.Writer
}

// runCommand runs c supervised as one unit: one socketpair per attachment,
// a helper on one end of each (--fd), the command on the others
// (descriptors 4, 5, ...); when the command exits the helpers stop. It
// returns the command's exit status. onReady is called once every helper is
// ready, before the command starts. Under sudo the command runs as the
// invoking user.
func (l launcher) runCommand(ctx context.Context, c vmCommand, nets networkByID, onReady func()) (int, error) {
	if len(c.command) == 0 {
		return 0, errors.New("no command to run (vmnetctl run ... -- COMMAND)")
	}
	var helpers []*helperexec.Helper
	stopAll := func() {
		var wg sync.WaitGroup
		for _, h := range helpers {
			wg.Go(func() { h.Stop() })
		}
		wg.Wait()
		l.sd.RemoveRunHelpers(c.project.Name)
	}
	defer stopAll()
	var recs []statedir.HelperRecord
	var vmEnds []*os.File
	defer func() { closeFiles(vmEnds) }()
	for _, a := range c.atts {
		helperEnd, vmEnd, err := socketpair()
		if err != nil {
			return 0, err
		}
		vmEnds = append(vmEnds, vmEnd)
		h, rec, err := l.start(ctx, helperStart{a: a, n: nets[a.Network], owner: c.project, fd: helperEnd})
		helperEnd.Close() // the helper has it now
		if err != nil {
			return 0, err
		}
		helpers = append(helpers, h)
		recs = append(recs, rec)
	}
	if err := l.sd.SaveRunHelpers(c.project.Name, recs); err != nil {
		return 0, err
	}
	if onReady != nil {
		onReady()
	}
	cmd, err := c.exec(vmEnds)
	closeFiles(vmEnds) // the command has them; the helpers see it go when it exits
	vmEnds = nil
	if err != nil {
		return 0, err
	}
	return waitCommand(cmd)
}

// exec starts the VMM with the VM's ends of the socketpairs.
func (c vmCommand) exec(vmEnds []*os.File) (*exec.Cmd, error) {
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, err
	}
	defer devnull.Close()
	cmd := exec.Command(c.command[0], c.command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = c.stdin, c.stdout, c.stderr
	cmd.ExtraFiles = append([]*os.File{devnull}, vmEnds...)
	var fds, macs []string
	for i, a := range c.atts {
		fds = append(fds, strconv.Itoa(FirstVMFD+i))
		macs = append(macs, a.MAC)
	}
	cmd.Env = append(os.Environ(), "VMNETCTL_FDS="+strings.Join(fds, ","), "VMNETCTL_MACS="+strings.Join(macs, ","))
	if uid, gid := helperproto.SudoID("SUDO_UID"), helperproto.SudoID("SUDO_GID"); os.Geteuid() == 0 && uid >= 0 && gid >= 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", c.command[0], err)
	}
	return cmd, nil
}

// waitCommand passes SIGINT and SIGTERM on to cmd and returns its exit
// status once it exits: 128+N when signal N killed it, as a shell says.
func waitCommand(cmd *exec.Cmd) (int, error) {
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

func closeFiles(fs []*os.File) {
	for _, f := range fs {
		f.Close()
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
