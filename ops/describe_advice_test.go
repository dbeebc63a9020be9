package ops

import (
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/ctlapi"
)

// TestAdviseNoVMM: an attachment no VMM came to is told the command that
// prints its VMM's arguments; a vhost-user one with the memory they need.
func TestAdviseNoVMM(t *testing.T) {
	for attach, want := range map[string]string{
		"socket":     "`vmnetctl args web`?",
		"vhost-user": "`vmnetctl args web --memory SIZE` (its -m)?",
	} {
		a := AttachmentDescription{AttachmentStatus: ctlapi.AttachmentStatus{VM: "web", Attach: attach, State: ctlapi.StateRunning, Peer: "waiting for VM"}}
		if got := strings.Join(advise(a, true), "\n"); !strings.Contains(got, want) {
			t.Errorf("%s: %q, want %q", attach, got, want)
		}
	}
}
