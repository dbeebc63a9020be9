package metrics

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

func TestParseStat(t *testing.T) {
	// A command name with spaces and parentheses, as a process may set it.
	stat := "4242 (vm (a) b) S 1 4242 4242 0 -1 4194560 1234 0 0 0 250 50 0 0 20 0 8 0 123456 1000000 500 18446744073709551615\n"
	p, err := parseStat([]byte(stat))
	if err != nil {
		t.Fatal(err)
	}
	if p.CPUSeconds != 3 {
		t.Errorf("CPUSeconds = %v, want 3 (250+50 ticks)", p.CPUSeconds)
	}
	if want := 500 * uint64(os.Getpagesize()); p.ResidentBytes != want {
		t.Errorf("ResidentBytes = %d, want %d (500 pages)", p.ResidentBytes, want)
	}
	if _, err := parseStat([]byte("4242 (x) S 1 2")); err == nil {
		t.Errorf("a short stat line parsed")
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
