package helperexec

// ProcIdentity names one process beyond its pid, which the kernel reuses:
// its start time (in clock ticks since boot) and its command line. A new
// controller adopts a helper only when all three match what was recorded.
type ProcIdentity struct {
	PID       int      `json:"pid"`
	StartTime uint64   `json:"startTime"`
	Cmdline   []string `json:"cmdline"`
}

// Alive reports whether the process recorded in id still runs, and is the
// same process (not a new one that got the pid).
func (id ProcIdentity) Alive() bool { return id.alive() }
