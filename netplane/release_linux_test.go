package netplane

import (
	"os/exec"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestHeldPortRelease: a TAP whose descriptor the controller holds
// outlives its helper's (the relay's exit does not wait for its deletion),
// is out of the list of links when Release returns, and a TAP of its name
// can be made at once.
func TestHeldPortRelease(t *testing.T) {
	testutil.RequireRoot(t, "makes TAPs in a network namespace")
	ns := testutil.NewNS(t, "held")
	const name = "vmt-held"
	// Children forked meanwhile hold copies of the held descriptor until
	// their exec: Release still returns only once the link is gone.
	stop := make(chan struct{})
	forks := make(chan struct{})
	go func() {
		defer close(forks)
		for {
			select {
			case <-stop:
				return
			default:
				exec.Command("true").Run()
			}
		}
	}()
	defer func() { close(stop); <-forks }()
	ns.MustDo(t, func() error {
		for round := range 100 {
			fd, err := createTap(PortConfig{Name: name, UID: -1, GID: -1})
			if err != nil {
				t.Errorf("round %d: %v", round, err)
				return nil
			}
			l, err := netlink.LinkByName(name)
			if err != nil {
				t.Errorf("round %d: %v", round, err)
				return nil
			}
			p := &Port{Name: name, FD: fd, Index: uint32(l.Attrs().Index)}
			h := p.Hold()
			if h == nil {
				t.Errorf("round %d: Hold kept no copy of a TAP's descriptor", round)
				return nil
			}
			p.CloseFD() // the helper's exit
			if _, err := netlink.LinkByName(name); err != nil {
				t.Errorf("round %d: the TAP went with the helper's descriptor, not the held one: %v", round, err)
			}
			h.Release()
			if _, err := netlink.LinkByName(name); !hostnet.NotFound(err) {
				t.Errorf("round %d: after Release, the TAP is still listed (%v)", round, err)
			}
			h.Release() // a second does nothing
		}
		return nil
	})
	// The closes go on in the background: each ends.
	for deadline := time.Now().Add(time.Minute); heldPorts.Load() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d ports still counted as held a minute on", heldPorts.Load())
		}
	}
	var nilHeld *HeldPort
	nilHeld.Release()
	if (&Port{Name: "x", FD: -1}).Hold() != nil {
		t.Error("Hold of a closed port kept something")
	}
}
