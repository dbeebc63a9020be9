package relay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/helperproto"
)

// spareHigh is where a spare keeps its socket and what it receives
// before it puts the descriptors in their places: above any of those.
const spareHigh = 256

// Spare is vmnetctl-relay started as a spare (helperproto.EnvSpare): it
// waits for the controller's HandOver, takes its descriptors where an
// exec would have put them (stdout, stderr, 3 on), writes the helper's
// command line over its own and is then that helper (HandedOver). It
// returns nil without serving when the controller closes its end first
// (before a hand-over, or before the helper's command line was shown), or
// ctx is done before a hand-over. ctx must already catch SIGTERM and
// SIGINT.
func Spare(ctx context.Context) error {
	ctl, err := strconv.Atoi(os.Getenv(helperproto.EnvSpare))
	if err != nil || ctl < 3 {
		return fmt.Errorf("%s=%q: not a descriptor", helperproto.EnvSpare, os.Getenv(helperproto.EnvSpare))
	}
	os.Unsetenv(helperproto.EnvSpare)
	// What a hand-over needs, tried before it waits: one it could not
	// take would fail an attach, where a spare that exits now is only
	// counted against its kind (helperexec.Spares).
	room, err := cmdlineRoom()
	if err != nil {
		return err
	}
	// Out of the way of the descriptors a hand-over brings.
	high, err := unix.FcntlInt(uintptr(ctl), unix.F_DUPFD_CLOEXEC, spareHigh)
	if err != nil {
		return fmt.Errorf("the controller's socket: %w", err)
	}
	unix.Close(ctl)
	ctl = high
	// Until it has a hand-over, SIGTERM ends it at once (it blocks in
	// recvmsg); once it has one, it is a helper, which SIGTERM stops.
	var mu sync.Mutex
	taken := false
	go func() {
		<-ctx.Done()
		mu.Lock()
		if !taken {
			os.Exit(0)
		}
		mu.Unlock()
	}()
	h, files, err := receiveHandOver(ctl, func() { mu.Lock(); taken = true; mu.Unlock() })
	closeAll := func() {
		unix.Close(ctl)
		for _, fd := range files {
			unix.Close(fd)
		}
	}
	if err != nil || h == nil {
		closeAll()
		return err
	}
	// The helper's command line first, by which a controller knows a
	// helper (strays, adoption); then whether the controller that sent
	// it still waits for its start (its end of the socket open). One
	// that died before has not recorded this helper, and the next one
	// may have looked for strays already: no helper, then. One that dies
	// after sees a helper's command line here.
	if err := setCmdline(room, h.Argv); err != nil {
		closeAll()
		return fmt.Errorf("a spare taking the command line of %s: %w", h.Argv[0], err)
	}
	if HungUp(ctl) {
		closeAll()
		return nil
	}
	unix.Close(ctl)
	// Where an exec would have put them: stdout, stderr, then 3 on, over
	// the /dev/null the spare was started with there; the rest of those
	// closed. Any of the received may sit where another goes: all go
	// high first, then down.
	for i, fd := range files {
		hi, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, spareHigh)
		if err != nil {
			return fmt.Errorf("a hand-over's descriptor: %w", err)
		}
		unix.Close(fd)
		files[i] = hi
	}
	for i, fd := range files {
		to := i + 1
		if err := unix.Dup3(fd, to, 0); err != nil {
			return fmt.Errorf("a hand-over's descriptor %d: %w", to, err)
		}
		unix.Close(fd)
	}
	for fd := max(len(files)+1, 3); fd < helperproto.SpareCtlFD; fd++ {
		unix.Close(fd)
	}
	os.Setenv(EnvSpec, h.Spec)
	return HandedOver(ctx, os.Stdout, os.Stderr)
}

// HungUp reports whether the other end of socket fd is closed.
func HungUp(fd int) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
	n, err := unix.Poll(p, 0)
	return err == nil && n > 0 && p[0].Revents&(unix.POLLHUP|unix.POLLRDHUP|unix.POLLERR) != 0
}

// cmdlineRoom is this process's command line, where the kernel reads
// /proc/PID/cmdline (arg_start to arg_end of /proc/self/stat), as memory
// it may write (setCmdline): os.Args[0] is where it begins (the Go
// runtime does not copy the arguments), which is checked against
// arg_start.
func cmdlineRoom() ([]byte, error) {
	stat, err := readSmall("/proc/self/stat")
	if err != nil {
		return nil, err
	}
	start, end, err := argArea(stat)
	if err != nil {
		return nil, err
	}
	if len(os.Args) == 0 || len(os.Args[0]) == 0 {
		return nil, errors.New("no command line to write over")
	}
	p := unsafe.StringData(os.Args[0])
	if uintptr(unsafe.Pointer(p)) != uintptr(start) {
		return nil, errors.New("os.Args[0] is not where the kernel's command line begins")
	}
	return unsafe.Slice(p, end-start), nil
}

// setCmdline writes argv over this process's command line (room,
// cmdlineRoom's), the rest NULs: what a process started with argv shows,
// and the trailing NULs procid.Read drops. It writes the memory itself,
// as setproctitle(3) does, with no system call that a seccomp filter or a
// missing capability could refuse (process_vm_writev is in systemd's
// @debug, which the packaged unit refuses; an undumpable process that is
// not root may not open its own /proc/self/mem). Go's os.Args change
// with it: nothing reads them after.
func setCmdline(room []byte, argv []string) error {
	var b []byte
	for _, a := range argv {
		b = append(append(b, a...), 0)
	}
	if len(b) > len(room) {
		return fmt.Errorf("%d bytes of command line where %d fit", len(b), len(room))
	}
	clear(room[copy(room, b):])
	return nil
}

// argArea is arg_start and arg_end of a /proc/PID/stat (fields 48 and
// 49, proc(5); since Linux 3.5).
func argArea(stat []byte) (start, end uint64, err error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, 0, errors.New("/proc/self/stat: no command name")
	}
	f := bytes.Fields(stat[i+1:]) // field 3 on
	const argStart = 48 - 3
	if len(f) <= argStart+1 {
		return 0, 0, errors.New("/proc/self/stat: no arg_start and arg_end (a kernel before 3.5)")
	}
	if start, err = strconv.ParseUint(string(f[argStart]), 10, 64); err == nil {
		end, err = strconv.ParseUint(string(f[argStart+1]), 10, 64)
	}
	if err != nil || end <= start {
		return 0, 0, fmt.Errorf("/proc/self/stat: arg_start and arg_end: %q %q", f[argStart], f[argStart+1])
	}
	return start, end, nil
}

// readSmall reads a small file with raw system calls: a spare takes no
// descriptor through Go's poller before its own are in place.
func readSmall(path string) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	buf := make([]byte, 4096)
	n, err := unix.Read(fd, buf)
	if err != nil {
		return nil, err
	}
	return buf[:n], nil
}

// receiveHandOver waits for the controller's one message on ctl and
// returns it with its descriptors (close-on-exec), calling got first;
// nil, nil, nil when the controller closed its end.
func receiveHandOver(ctl int, got func()) (*helperproto.HandOver, []int, error) {
	buf := make([]byte, helperproto.MaxHandOver+1)
	oob := make([]byte, unix.CmsgSpace(4*helperproto.MaxHandOverFiles))
	for {
		n, oobn, flags, _, err := unix.Recvmsg(ctl, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("waiting for a hand-over: %w", err)
		}
		if n == 0 && oobn == 0 {
			return nil, nil, nil // the controller closed its end
		}
		got()
		var files []int
		if cmsgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, m := range cmsgs {
				if fds, err := unix.ParseUnixRights(&m); err == nil {
					files = append(files, fds...)
				}
			}
		}
		fail := func(err error) (*helperproto.HandOver, []int, error) {
			for _, fd := range files {
				unix.Close(fd)
			}
			return nil, nil, err
		}
		if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
			return fail(errors.New("a hand-over cut short"))
		}
		h, err := helperproto.DecodeHandOver(buf[:n])
		if err != nil {
			return fail(err)
		}
		if len(files) != h.Files {
			return fail(fmt.Errorf("a hand-over of %d descriptors came with %d", h.Files, len(files)))
		}
		return &h, files, nil
	}
}
