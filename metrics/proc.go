package metrics

import "errors"

// Process is what the kernel accounts to one process.
type Process struct {
	// CPUSeconds is user plus system time since the process started.
	CPUSeconds float64
	// ResidentBytes is its resident set size.
	ResidentBytes uint64
}

// ErrUnsupported is ReadProcess's error where there is no /proc.
var ErrUnsupported = errors.New("process accounting is not supported on this platform")
