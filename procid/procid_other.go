//go:build !linux

package procid

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
)

// Read reads a process's identity with ps(1), where there is no /proc.
func Read(pid int) (Identity, error) {
	out, err := exec.Command("ps", "-o", "lstart=,command=", "-p", strconv.Itoa(pid)).Output()
	if err != nil {
		return Identity{}, err
	}
	f := strings.Fields(string(out))
	if len(f) < 6 {
		return Identity{}, errors.New("ps: unexpected output")
	}
	// lstart is five words ("Sun Nov 22 15:30:00 2026"); fold it into a number
	// that differs between processes started at different seconds.
	var start uint64
	for _, c := range strings.Join(f[:5], " ") {
		start = start*31 + uint64(c)
	}
	return Identity{PID: pid, StartTime: start, Cmdline: f[5:]}, nil
}

func (id Identity) alive() bool {
	if id.PID <= 0 {
		return false
	}
	cur, err := Read(id.PID)
	return err == nil && cur.StartTime == id.StartTime && strings.Join(cur.Cmdline, " ") == strings.Join(id.Cmdline, " ")
}

// Processes returns the identity of every running process whose command
// line match accepts, from ps(1).
func Processes(match func(cmdline []string) bool) ([]Identity, error) {
	out, err := exec.Command("ps", "-A", "-o", "pid=").Output()
	if err != nil {
		return nil, err
	}
	var ids []Identity
	for _, f := range strings.Fields(string(out)) {
		pid, err := strconv.Atoi(f)
		if err != nil || pid == os.Getpid() {
			continue
		}
		if id, err := Read(pid); err == nil && match(id.Cmdline) {
			ids = append(ids, id)
		}
	}
	return ids, nil
}
