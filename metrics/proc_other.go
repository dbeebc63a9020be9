//go:build !linux

package metrics

// ReadProcess is not implemented without /proc: the metrics that need it
// are left out.
func ReadProcess(pid int) (Process, error) { return Process{}, ErrUnsupported }
