//go:build !linux

package helperexec

// readProgress: without /proc, a helper's progress cannot be read; Start
// then waits for its stall timeout from the start alone.
func readProgress(int) (progress, bool) { return progress{}, false }
