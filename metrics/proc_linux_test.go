package metrics

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/procid"
)

// TestProcessOf: a process's CPU time is its user and system ticks
// together, its resident set its pages in bytes.
func TestProcessOf(t *testing.T) {
	p := processOf(procid.Stat{UTime: 250, STime: 50, RSSPages: 500})
	if p.CPUSeconds != 3 {
		t.Errorf("CPUSeconds = %v, want 3 (250+50 ticks)", p.CPUSeconds)
	}
	if want := 500 * uint64(os.Getpagesize()); p.ResidentBytes != want {
		t.Errorf("ResidentBytes = %d, want %d (500 pages)", p.ResidentBytes, want)
	}
}

func TestReadProcessSelf(t *testing.T) {
	p, err := ReadProcess(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if p.ResidentBytes < 1<<20 || p.CPUSeconds < 0 {
		t.Errorf("ReadProcess(self) = %+v", p)
	}
	// The resident set is statm's (read once, the process a moment later).
	statm, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		t.Fatal(err)
	}
	pages, err := strconv.ParseUint(strings.Fields(string(statm))[1], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := float64(p.ResidentBytes), float64(pages*uint64(os.Getpagesize())); got < 0.9*want || got > 1.1*want {
		t.Errorf("resident %v bytes, statm says %v", got, want)
	}
}

// TestReadProcessAllocs: a scrape reads every helper's process; the
// files are read into a buffer on the stack and parsed in place (with
// os.ReadFile and strings.Fields a read made 20 allocations).
func TestReadProcessAllocs(t *testing.T) {
	pid := os.Getpid()
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := ReadProcess(pid); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 8 {
		t.Errorf("ReadProcess: %.0f allocations a read, want at most 8", allocs)
	}
}
