package controller

import "testing"

// TestSessionLines: the lines of a stream's relay and of a vhost-user
// backend that say a VMM came and went are told apart from the rest.
func TestSessionLines(t *testing.T) {
	for _, c := range []struct {
		line           string
		started, ended bool
	}{
		{`2026-12-05T17:00:00.000Z INFO  [main] serving a client on "/run/vmnetctl/vms/dev/0.sock"`, true, false},
		{`INFO  [main] client gone (EOF): waiting for the next`, false, true},
		{`2026-12-05T17:00:00.000Z INFO  [vhost-user] a VMM connected`, true, false},
		{`INFO  [vhost-user] the VMM went; waiting for the next`, false, true},
		{`INFO  [vhost-user] the VMM's session ended: virtqueue: loops; waiting for the next VMM`, false, true},
		{`INFO  [main] serving client "/run/vmnetctl/vms/web/0.vm.sock"`, false, false},
		{`INFO  [main] waiting for client on "/run/vmnetctl/vms/dev/0.sock"`, false, false},
	} {
		if got := sessionStarted(c.line); got != c.started {
			t.Errorf("sessionStarted(%q) = %v", c.line, got)
		}
		if got := sessionEnded(c.line); got != c.ended {
			t.Errorf("sessionEnded(%q) = %v", c.line, got)
		}
	}
}
