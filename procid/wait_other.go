//go:build !linux

package procid

import (
	"syscall"
)

// procHandle is one process, by its identity (there are no pidfds here).
type procHandle struct{ id Identity }

func (id Identity) open() (*procHandle, bool) { return &procHandle{id}, id.Alive() }

func (p *procHandle) signal(sig syscall.Signal) {
	if p.id.Alive() {
		syscall.Kill(p.id.PID, sig)
	}
}

func (p *procHandle) wait()              { pollExit(p.id) }
func (p *procHandle) close()             {}
func (p *procHandle) onExit(func()) bool { return false }

// WaitGone does nothing here: the caller's exec.Cmd.Wait waits.
func WaitGone(int) {}
