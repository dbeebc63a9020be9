//go:build !linux

package helperexec

import (
	"syscall"
	"time"
)

// WaitExit returns when the process of id is gone.
func (id ProcIdentity) WaitExit() {
	for id.Alive() {
		time.Sleep(200 * time.Millisecond)
	}
}

// procHandle is one process, by its identity (there are no pidfds here).
type procHandle struct{ id ProcIdentity }

func (id ProcIdentity) open() (*procHandle, bool) { return &procHandle{id}, id.Alive() }

func (p *procHandle) signal(sig syscall.Signal) {
	if p.id.Alive() {
		syscall.Kill(p.id.PID, sig)
	}
}

func (p *procHandle) wait()  { p.id.WaitExit() }
func (p *procHandle) close() {}

// waitGone does nothing here: the caller's exec.Cmd.Wait waits.
func waitGone(int) {}
