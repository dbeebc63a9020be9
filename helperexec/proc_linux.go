package helperexec

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// errNoCmdline: a process in the middle of an exec (a helper becoming
// vmnetctl-relay) shows no command line for a moment.
var errNoCmdline = errors.New("no command line (yet)")

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
	if fields[0] == "Z" {
		return ProcIdentity{}, fmt.Errorf("process %d is a zombie", pid)
	}
	start, err := strconv.ParseUint(fields[19], 10, 64)
	if err != nil {
		return ProcIdentity{}, fmt.Errorf("/proc/%d/stat: start time: %w", pid, err)
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return ProcIdentity{}, err
	}
	if len(raw) == 0 {
		// Just after exec the kernel has not set up the new command line
		// yet (or the process is exiting): no identity to record.
		return ProcIdentity{PID: pid, StartTime: start}, fmt.Errorf("process %d: %w", pid, errNoCmdline)
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
	cur, err := ReadProcIdentity(id.PID)
	if errors.Is(err, errNoCmdline) {
		// Mid-exec: the same process if it started when id's did (the
		// command line only guards that further).
		return cur.StartTime == id.StartTime
	}
	if err != nil || cur.StartTime != id.StartTime || len(cur.Cmdline) != len(id.Cmdline) {
		return false
	}
	for i := range cur.Cmdline {
		if cur.Cmdline[i] != id.Cmdline[i] {
			return false
		}
	}
	return true
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
