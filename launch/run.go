package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/backend"
	"github.com/vmnetctl/vmnetctl/helperexec"
	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/spec"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// FirstVMFD is the descriptor number of the VM's first attachment in the
// command `vmnetctl run` starts; the next attachment has the next number.
// Descriptor 3 is left to /dev/null, as in vmnet-helper's vmnet-run, where
// it is the helper's.
const FirstVMFD = 4

// VMCommand is what `vmnetctl run` runs: the VM's attachments, each on a
// socketpair with a helper on the other end, and the VMM's command line.
type VMCommand struct {
	Project     *statedir.Project
	Attachments []*spec.Attachment
	Command     []string
	Stdin       io.Reader
	Stdout      io.Writer
	Stderr      io.Writer
}

// RunCommand runs c supervised as one unit: a helper per attachment, the
// command with the VM's ends (descriptors 4, 5, ...; see RunFDs); when the
// command exits the helpers stop. A socket attachment is a socketpair with
// the helper on one end (--fd). An `attach: tap` attachment is its TAP
// itself, opened for the command (qemu's `-netdev tap,fd=N`), with a
// vhost-net descriptor where the host has one: frames then never leave the
// kernel, and the helper only owns and watches the TAP. It returns the
// command's exit status. onReady is called once every helper is ready,
// before the command starts. Under sudo the command runs as the invoking
// user.
func (l Launcher) RunCommand(ctx context.Context, c VMCommand, nets NetworkByID, onReady func()) (int, error) {
	if len(c.Command) == 0 {
		return 0, errors.New("no command to run (vmnetctl run ... -- COMMAND)")
	}
	var helpers []*helperexec.Helper
	stopAll := func() {
		var wg sync.WaitGroup
		for _, h := range helpers {
			wg.Go(func() { h.Stop() })
		}
		wg.Wait()
		l.StateDir.RemoveRunHelpers(c.Project.Name)
	}
	defer stopAll()
	var recs []statedir.HelperRecord
	var vmEnds, vhosts []*os.File
	defer func() { closeFiles(vmEnds); closeFiles(vhosts) }()
	th, kernelPath := l.Backend.(backend.TAPHandler)
	for _, a := range c.Attachments {
		tap := kernelPath && a.Attach == api.AttachTAP
		var helperEnd, vmEnd *os.File
		if !tap {
			var err error
			if helperEnd, vmEnd, err = socketpair(nets[a.Network].Offloads); err != nil {
				return 0, err
			}
			vmEnds = append(vmEnds, vmEnd)
		}
		h, rec, err := l.Start(ctx, HelperStart{Attachment: a, Network: nets[a.Network], Owner: c.Project, fd: helperEnd})
		if helperEnd != nil {
			helperEnd.Close() // the helper has it now
		}
		if err != nil {
			return 0, err
		}
		helpers = append(helpers, h)
		recs = append(recs, rec)
		if tap {
			f, err := th.OpenTAP(rec.Tap)
			if err != nil {
				return 0, fmt.Errorf("%s: %w", a.Key(), err)
			}
			vmEnds = append(vmEnds, f)
			// Without vhost-net (none, or it does not open here) the
			// VMM moves the TAP's frames itself.
			if v, err := th.OpenVhost(); err == nil {
				vhosts = append(vhosts, v)
			}
		}
	}
	if taps := countTAPs(c.Attachments, kernelPath); len(vhosts) != taps {
		// vhost-net for every TAP entry or for none: RunFDs numbers them
		// so (and args prints them so).
		closeFiles(vhosts)
		vhosts = nil
	}
	if err := l.StateDir.SaveRunHelpers(c.Project.Name, recs); err != nil {
		return 0, err
	}
	if onReady != nil {
		onReady()
	}
	cmd, err := c.exec(append(slices.Clone(vmEnds), vhosts...), len(vhosts) > 0)
	closeFiles(vmEnds) // the command has them; the helpers see it go when it exits
	closeFiles(vhosts)
	vmEnds, vhosts = nil, nil
	if err != nil {
		return 0, err
	}
	return waitCommand(cmd)
}

// countTAPs is how many of atts run is to hand over as TAPs.
func countTAPs(atts []*spec.Attachment, kernelPath bool) int {
	n := 0
	for _, a := range atts {
		if kernelPath && a.Attach == api.AttachTAP {
			n++
		}
	}
	return n
}

// RunFDs are the descriptors `vmnetctl run` gives its command for a VM whose
// attachments are TAPs where taps says so: attachment i at FirstVMFD+i (its
// socket, or its TAP), then, with vhost-net, one vhost-net descriptor per
// TAP attachment in order (vhostFDs[i] is -1 for a socket attachment). It is
// what `vmnetctl args --fds` prints, so the two agree.
func RunFDs(taps []bool, vhost bool) (fds, vhostFDs []int) {
	next := FirstVMFD + len(taps)
	for i, tap := range taps {
		fds = append(fds, FirstVMFD+i)
		v := -1
		if tap && vhost {
			v, next = next, next+1
		}
		vhostFDs = append(vhostFDs, v)
	}
	return fds, vhostFDs
}

// exec starts the VMM with files, the VM's ends as RunFDs numbers them
// (vhost: the TAP attachments have vhost-net descriptors after them).
func (c VMCommand) exec(files []*os.File, vhost bool) (*exec.Cmd, error) {
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, err
	}
	defer devnull.Close()
	cmd := exec.Command(c.Command[0], c.Command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = c.Stdin, c.Stdout, c.Stderr
	cmd.ExtraFiles = append([]*os.File{devnull}, files...)
	var taps []bool
	var macs []string
	for _, a := range c.Attachments {
		taps = append(taps, a.Attach == api.AttachTAP)
		macs = append(macs, a.MAC)
	}
	fds, vhostFDs := RunFDs(taps, vhost)
	cmd.Env = append(os.Environ(), "VMNETCTL_FDS="+joinInts(fds, ""), "VMNETCTL_VHOSTFDS="+joinInts(vhostFDs, ""),
		"VMNETCTL_MACS="+strings.Join(macs, ","))
	if uid, gid := helperproto.SudoID("SUDO_UID"), helperproto.SudoID("SUDO_GID"); os.Geteuid() == 0 && uid >= 0 && gid >= 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", c.Command[0], err)
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

// joinInts joins ns with commas, writing none for -1.
func joinInts(ns []int, none string) string {
	words := make([]string, len(ns))
	for i, n := range ns {
		words[i] = none
		if n >= 0 {
			words[i] = strconv.Itoa(n)
		}
	}
	return strings.Join(words, ",")
}

func closeFiles(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

func socketpair(offloads bool) (helperEnd, vmEnd *os.File, err error) {
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
		// Best effort, as vmnet-helper's vmnet-run: the kernel's defaults
		// work, only slower.
		helperproto.SetSocketBuffers(fd, offloads)
	}
	return os.NewFile(uintptr(fds[0]), "helper-end"), os.NewFile(uintptr(fds[1]), "vm-end"), nil
}

// NetworkByID are networks by their ID.
type NetworkByID map[string]*api.Network
