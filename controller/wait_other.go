//go:build !linux

package controller

import "time"

// waitExit returns when the process of id is gone.
func waitExit(id ProcIdentity) {
	for id.Alive() {
		time.Sleep(200 * time.Millisecond)
	}
}
