package controller

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/launch"
	"github.com/vmnetctl/vmnetctl/spec"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// TestRetryNowReachesStartsUnderWay: an `up` that asks for a try now
// while another pass is starting the helper (a retry after its backoff)
// gets a try begun after its ask. The start under way checked for room
// before the cause was put right; if it fails, the helper is due at
// once, not after its backoff, so that the up's own pass tries it again
// instead of answering with the old error (a CI run: the task limit
// raised, the up refused with the limit of before).
func TestRetryNowReachesStartsUnderWay(t *testing.T) {
	for _, ask := range []bool{false, true} {
		c := &Controller{sd: statedir.Dir{Path: t.TempDir()}, log: slog.New(slog.DiscardHandler), helpers: map[string]*helperProc{}}
		a := &spec.Attachment{Attachment: &api.Attachment{VM: "f024", Network: "shared"}, Project: "p"}
		prev := &helperProc{exited: closedChan()}
		c.setFailed(a, prev, 0, DefaultBackoff(), "no room for its process")
		// planLaunches: the helper is due after its backoff, and starting.
		c.helpers[a.Key()] = &helperProc{att: a, exited: closedChan(), state: ctlapi.StateStarting, rec: launch.NewHelperRecord(a, 1)}
		if ask {
			c.retryNow("p")
		}
		launches := []*helperLaunch{{a: a, prev: prev, restarts: 1, bo: prev.backoff, err: errors.New("no room for its process")}}
		c.commitLaunches(launches)
		h := c.helpers[a.Key()]
		if h.state != ctlapi.StateFailed {
			t.Fatalf("ask=%v: state %q after a failed start, want %q", ask, h.state, ctlapi.StateFailed)
		}
		_, _, due := c.restartDue(a, h, time.Now())
		if due != ask {
			t.Errorf("ask=%v: a start that failed is due at once: %v, want %v", ask, due, ask)
		}
	}
}
