package helperexec

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

// ReadProcIdentity reads the identity of a running process from /proc.
func ReadProcIdentity(pid int) (ProcIdentity, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ProcIdentity{}, err
	}
	// The command name (field 2) is in parentheses and may hold spaces or
	// parentheses itself: fields are counted from the last ')'.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return ProcIdentity{}, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	fields := strings.Fields(string(stat[i+1:]))
	// fields[0] is field 3 (state); starttime is field 22.
	if len(fields) < 20 {
		return ProcIdentity{}, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	start, err := strconv.ParseUint(fields[19], 10, 64)
	if err != nil {
		return ProcIdentity{}, fmt.Errorf("/proc/%d/stat: start time: %w", pid, err)
	}
	if fields[0] == "Z" {
		if liveThread(pid) {
			return ProcIdentity{PID: pid, StartTime: start}, fmt.Errorf("process %d: %w", pid, errMidExec)
		}
		return ProcIdentity{}, fmt.Errorf("process %d is a zombie", pid)
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return ProcIdentity{}, err
	}
	if len(raw) == 0 {
		// Just after exec the kernel has not set up the new command line
		// yet (or the process is exiting): no identity to record.
		return ProcIdentity{PID: pid, StartTime: start}, fmt.Errorf("process %d has no command line: %w", pid, errMidExec)
	}
	cmdline := strings.Split(strings.TrimSuffix(string(raw), "\x00"), "\x00")
	return ProcIdentity{PID: pid, StartTime: start, Cmdline: cmdline}, nil
}

// alive reports whether the process recorded in id still runs, and is the
// same process (not a new one that got the pid).
func (id ProcIdentity) alive() bool {
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
func (id ProcIdentity) same() (bool, error) {
	cur, err := ReadProcIdentity(id.PID)
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
func Processes(match func(cmdline []string) bool) ([]ProcIdentity, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []ProcIdentity
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		id, err := ReadProcIdentity(pid)
		if err == nil && match(id.Cmdline) {
			out = append(out, id)
		}
	}
	return out, nil
}

// liveThread says whether a process whose first thread is a zombie still
// has a thread that is not: one exec'ing, or still running on its own.
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
		if i := bytes.LastIndexByte(st, ')'); i >= 0 && i+2 < len(st) && st[i+2] != 'Z' && st[i+2] != 'X' {
			return true
		}
	}
	return false
}
