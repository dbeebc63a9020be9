//go:build !linux

package procid

import (
	"os/exec"
	"syscall"
)

// Child is a process this one started (os/exec's, here: no pidfds).
type Child struct {
	Pid int
	cmd *exec.Cmd
}

// Start starts cmd (exec.Cmd.Start). Reap it with Wait.
func Start(cmd *exec.Cmd) (*Child, error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &Child{Pid: cmd.Process.Pid, cmd: cmd}, nil
}

// Wait returns once the child has exited, reaped (exec.Cmd.Wait).
func (c *Child) Wait() error { return c.cmd.Wait() }

// Signal sends sig to the child.
func (c *Child) Signal(sig syscall.Signal) { c.cmd.Process.Signal(sig) }

// OnExit has f called with what Wait returns, once the child has exited.
func (c *Child) OnExit(f func(error)) { go func() { f(c.Wait()) }() }
