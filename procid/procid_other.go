//go:build !linux

package helperexec

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
)

// ReadProcIdentity reads a process's identity with ps(1), where there is no /proc.
func ReadProcIdentity(pid int) (ProcIdentity, error) {
	out, err := exec.Command("ps", "-o", "lstart=,command=", "-p", strconv.Itoa(pid)).Output()
	if err != nil {
		return ProcIdentity{}, err
	}
	f := strings.Fields(string(out))
	if len(f) < 6 {
		return ProcIdentity{}, errors.New("ps: unexpected output")
	}
	// lstart is five words ("Sun Nov 22 15:30:00 2026"); fold it into a number
	// that differs between processes started at different seconds.
	var start uint64
	for _, c := range strings.Join(f[:5], " ") {
		start = start*31 + uint64(c)
	}
	return ProcIdentity{PID: pid, StartTime: start, Cmdline: f[5:]}, nil
}

func (id ProcIdentity) alive() bool {
	if id.PID <= 0 {
		return false
	}
	cur, err := ReadProcIdentity(id.PID)
	return err == nil && cur.StartTime == id.StartTime && strings.Join(cur.Cmdline, " ") == strings.Join(id.Cmdline, " ")
}

// Processes returns the identity of every running process whose command
// line match accepts, from ps(1).
func Processes(match func(cmdline []string) bool) ([]ProcIdentity, error) {
	out, err := exec.Command("ps", "-A", "-o", "pid=").Output()
	if err != nil {
		return nil, err
	}
	var ids []ProcIdentity
	for _, f := range strings.Fields(string(out)) {
		pid, err := strconv.Atoi(f)
		if err != nil || pid == os.Getpid() {
			continue
		}
		if id, err := ReadProcIdentity(pid); err == nil && match(id.Cmdline) {
			ids = append(ids, id)
		}
	}
	return ids, nil
}
