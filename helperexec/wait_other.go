//go:build !linux

package helperexec

import "time"

// WaitExit returns when the process of id is gone.
func (id ProcIdentity) WaitExit() {
	for id.Alive() {
		time.Sleep(200 * time.Millisecond)
	}
}

// waitGone does nothing here: the caller's exec.Cmd.Wait waits.
func waitGone(int) {}
