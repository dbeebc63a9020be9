package metrics

import (
	"os"

	"github.com/vmnetctl/vmnetctl/procid"
)

// userHZ is the unit of /proc/PID/stat's times (sysconf(_SC_CLK_TCK)). The
// kernel fixes it at 100 for every architecture Go supports, which is why
// the Go and procfs ecosystems hard-code it rather than call into libc.
const userHZ = 100

// ReadProcess reads pid's CPU time (utime + stime) and its resident memory
// (rss) from /proc/PID/stat (procid.ReadStat, its one parser). A scrape
// reads it for every helper: the file is read into a buffer on the stack
// and its fields found in place, and it is the one file (statm's resident
// count is the same number, get_mm_rss, for a second open).
func ReadProcess(pid int) (Process, error) {
	st, err := procid.ReadStat(pid)
	if err != nil {
		return Process{}, err
	}
	return processOf(st), nil
}

// processOf is what the metrics take of a process's stat.
func processOf(st procid.Stat) Process {
	return Process{CPUSeconds: float64(st.UTime+st.STime) / userHZ, ResidentBytes: st.RSSPages * uint64(os.Getpagesize())}
}
