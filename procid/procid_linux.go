package procid

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// errMidExec: a process in the middle of an exec (a helper becoming
// vmnetctl-relay) shows, for a moment, no command line, or, when a thread
// other than its first execs (Go may exec from any thread), its first
// thread as a zombie while the kernel hands its pid to the exec'ing one.
var errMidExec = errors.New("in the middle of an exec")

// errExiting: a process that is exiting (killed, say) but not yet a
// zombie. It shows no command line either, like one mid-exec, but it is
// gone for every purpose here: a controller killed a moment ago is no
// live starter whose helpers a new controller must leave alone.
var errExiting = errors.New("exiting")

// The kernel's PF_EXITING and PF_KTHREAD, in /proc/PID/stat's flags.
const (
	pfExiting = 0x4
	pfKthread = 0x200000
)

// Read reads the identity of a running process from /proc.
func Read(pid int) (Identity, error) {
	st, err := ReadStat(pid)
	if err != nil {
		return Identity{}, err
	}
	start := st.StartTime
	// (Exiting and still not a zombie: the thread group's leader exits
	// last, so a Go process mid-exec, whose first thread may be the one
	// to go, is told by its zombie leader below.)
	if st.Flags&pfKthread != 0 { // no command line, ever
		return Identity{}, fmt.Errorf("process %d is a kernel thread", pid)
	}
	if st.Flags&pfExiting != 0 && !liveThread(pid) {
		return Identity{}, fmt.Errorf("process %d: %w", pid, errExiting)
	}
	if st.State == 'Z' {
		if liveThread(pid) {
			return Identity{PID: pid, StartTime: start}, fmt.Errorf("process %d: %w", pid, errMidExec)
		}
		return Identity{}, fmt.Errorf("process %d is a zombie", pid)
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return Identity{}, err
	}
	if len(raw) == 0 {
		// Just after exec the kernel has not set up the new command line
		// yet (or the process is exiting): no identity to record.
		return Identity{PID: pid, StartTime: start}, fmt.Errorf("process %d has no command line: %w", pid, errMidExec)
	}
	// (All trailing NULs: a spare relay that took a helper's command line
	// leaves them after it, where its own was longer; helperproto.FitsSpare.)
	cmdline := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
	return Identity{PID: pid, StartTime: start, Cmdline: cmdline}, nil
}

// alive reports whether the process recorded in id still runs, and is the
// same process (not a new one that got the pid).
func (id Identity) alive() bool {
	if id.PID <= 0 {
		return false
	}
	// What an exec shows of a process for a moment (errMidExec) is read
	// again a few times before a process that still has its pid is
	// called gone: taking a live helper for gone drops its network.
	for try := 0; ; try++ {
		same, err := id.same()
		if same || err == nil || try == 5 || syscall.Kill(id.PID, 0) != nil {
			return same
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// same compares id with the process that has its pid now; err is the
// reason it could not tell, nil when it could.
func (id Identity) same() (bool, error) {
	cur, err := Read(id.PID)
	if errors.Is(err, errExiting) {
		return false, nil
	}
	if errors.Is(err, errMidExec) {
		// Mid-exec: the same process if it started when id's did (the
		// command line only guards that further).
		return cur.StartTime == id.StartTime, nil
	}
	if err != nil {
		return false, err
	}
	if cur.StartTime != id.StartTime || len(cur.Cmdline) != len(id.Cmdline) {
		return false, nil
	}
	for i := range cur.Cmdline {
		if cur.Cmdline[i] != id.Cmdline[i] {
			return false, nil
		}
	}
	return true, nil
}

// Processes returns the identity of every running process whose command
// line match accepts.
func Processes(match func(cmdline []string) bool) ([]Identity, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []Identity
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		id, err := Read(pid)
		// A process caught mid-exec (a helper becoming vmnetctl-relay)
		// shows its command line again in a moment: read again a few
		// times, as alive does, or a stray helper would be missed.
		for try := 0; errors.Is(err, errMidExec) && try < 5; try++ {
			time.Sleep(20 * time.Millisecond)
			id, err = Read(pid)
		}
		if err == nil && match(id.Cmdline) {
			out = append(out, id)
		}
	}
	return out, nil
}

// liveThread says whether a process whose first thread is a zombie (or
// exiting) still has a thread that is neither: one exec'ing, or still
// running on its own.
func liveThread(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return false
	}
	for _, t := range tasks {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, t.Name()))
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(st, ')')
		if i < 0 || i+2 >= len(st) || st[i+2] == 'Z' || st[i+2] == 'X' {
			continue
		}
		// Nor one that is exiting (a killed process's threads are, for a
		// moment, before they are zombies).
		if f := strings.Fields(string(st[i+1:])); len(f) > 6 {
			if flags, err := strconv.ParseUint(f[6], 10, 64); err == nil && flags&pfExiting != 0 {
				continue
			}
		}
		return true
	}
	return false
}
