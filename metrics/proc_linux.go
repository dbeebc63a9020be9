package metrics

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// userHZ is the unit of /proc/PID/stat's times (sysconf(_SC_CLK_TCK)). The
// kernel fixes it at 100 for every architecture Go supports, which is why
// the Go and procfs ecosystems hard-code it rather than call into libc.
const userHZ = 100

// ReadProcess reads pid's CPU time from /proc/PID/stat (utime + stime) and
// its resident memory from /proc/PID/statm.
func ReadProcess(pid int) (Process, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return Process{}, err
	}
	p, err := parseStat(stat)
	if err != nil {
		return Process{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	statm, err := os.ReadFile(fmt.Sprintf("/proc/%d/statm", pid))
	if err != nil {
		return Process{}, err
	}
	f := strings.Fields(string(statm))
	if len(f) < 2 {
		return Process{}, fmt.Errorf("/proc/%d/statm: too few fields", pid)
	}
	pages, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		return Process{}, fmt.Errorf("/proc/%d/statm: resident: %w", pid, err)
	}
	p.ResidentBytes = pages * uint64(os.Getpagesize())
	return p, nil
}

// parseStat reads utime and stime (fields 14 and 15) of a /proc/PID/stat.
func parseStat(stat []byte) (Process, error) {
	// The command name (field 2) is in parentheses and may hold spaces or
	// parentheses itself: fields are counted from the last ')'.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return Process{}, fmt.Errorf("unexpected format")
	}
	f := strings.Fields(string(stat[i+1:]))
	// f[0] is field 3 (state): utime is field 14, stime field 15.
	if len(f) < 13 {
		return Process{}, fmt.Errorf("too few fields")
	}
	utime, err := strconv.ParseUint(f[11], 10, 64)
	if err != nil {
		return Process{}, fmt.Errorf("utime: %w", err)
	}
	stime, err := strconv.ParseUint(f[12], 10, 64)
	if err != nil {
		return Process{}, fmt.Errorf("stime: %w", err)
	}
	return Process{CPUSeconds: float64(utime+stime) / userHZ}, nil
}
