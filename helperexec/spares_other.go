//go:build !linux

package helperexec

import (
	"os/exec"
	"time"
)

// Spares are relays started ahead of need: vmnetctl-relay's, on Linux
// only. Elsewhere none is kept.
type Spares struct{}

// NewSpares keeps none here.
func NewSpares(per int, idle time.Duration, stateDir string) *Spares { return nil }

func (s *Spares) take(cmd *exec.Cmd) (pid int, onExit func(func(error)), done func(bool), ok bool) {
	return 0, nil, nil, false
}

// Drain does nothing here.
func (s *Spares) Drain() {}

// Refill does nothing here.
func (s *Spares) Refill() {}

// Trim does nothing here.
func (s *Spares) Trim() {}

// Close does nothing here.
func (s *Spares) Close() {}
