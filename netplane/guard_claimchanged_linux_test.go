package netplane

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/guard"
	"github.com/vmnetctl/vmnetctl/nettypes"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestClaimsChangedAsFull: ClaimPortsChanged, told only what changed,
// leaves a network's claims as ClaimPorts, given every port's MAC, leaves
// another's. Two networks side by side take the same 250 random steps:
// ports that come, go, get another MAC or take another port's, and a real
// learning port that sends from some MAC (learned, or refused); one is
// claimed through ClaimPortsChanged (ClaimPorts where it cannot tell, as
// the Linux backend does), the other through ClaimPorts; their guards'
// sets are compared after each step.
func TestClaimsChangedAsFull(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	type side struct {
		host  *testutil.NS
		n     *api.Network
		state func() *guard.State
		vm    *testutil.RawSender
	}
	var sides [2]side
	for i, label := range []string{"cd", "cf"} {
		host, n, state := claimLab(t, label, fmt.Sprintf("10.200.%d.0/24", 61+i))
		sides[i] = side{host, n, state, plugLearning(t, host, n, "p-r", testutil.NewNS(t, label+"-r"))}
	}
	delta, full := sides[0], sides[1]
	var pool []net.HardwareAddr
	for i := range 10 {
		pool = append(pool, mustMAC(fmt.Sprintf("52:55:55:00:61:%02x", i)))
	}
	ports := []string{"p-r", "p-1", "p-2", "p-3", "p-4", "p-5", "p-6"}
	rng := rand.New(rand.NewPCG(61, 62))
	want := map[string]net.HardwareAddr{}
	owner := func(mac net.HardwareAddr) string {
		for p, m := range want {
			if m.String() == mac.String() {
				return p
			}
		}
		return ""
	}
	for _, s := range sides {
		s.host.MustDo(t, func() error {
			return guard.ClaimPorts(ctx, s.n, map[string]net.HardwareAddr{}, nettypes.ClaimOptions{Reread: true})
		})
	}
	handled := 0
	for step := range 250 {
		prev := maps.Clone(want)
		port, mac := ports[rng.IntN(len(ports))], pool[rng.IntN(len(pool))]
		what := ""
		switch rng.IntN(6) {
		case 0, 1: // a VM attached, or given another MAC
			if owner(mac) == "" {
				want[port], what = mac, fmt.Sprintf("%s expects %s", port, mac)
			}
		case 2: // a VM detached
			delete(want, port)
			what = port + " goes"
		case 3: // a MAC moves to another port (a VM's TAP renamed)
			if o := owner(mac); o != "" && o != port {
				delete(want, o)
				want[port], what = mac, fmt.Sprintf("%s moves from %s to %s", mac, o, port)
			}
		default: // the real port's VM sends from mac
			what = "p-r sends from " + mac.String()
			for _, s := range sides {
				learnedOrRefused(t, ctx, s.host, s.n, s.state, s.vm, mac)
			}
		}
		expect := map[string]net.HardwareAddr{}
		var drop []string
		for p, m := range want {
			if prev[p].String() != m.String() {
				expect[p] = m
			}
		}
		for p := range prev {
			if _, ok := want[p]; !ok {
				drop = append(drop, p)
			}
		}
		delta.host.MustDo(t, func() error {
			ok, err := guard.ClaimPortsChanged(ctx, delta.n, expect, drop, nettypes.ClaimOptions{})
			if ok {
				handled++
				return err
			}
			return guard.ClaimPorts(ctx, delta.n, maps.Clone(want), nettypes.ClaimOptions{})
		})
		full.host.MustDo(t, func() error { return guard.ClaimPorts(ctx, full.n, maps.Clone(want), nettypes.ClaimOptions{}) })
		d, f := delta.state(), full.state()
		if diff := cmp.Diff(f, d, cmpopts.IgnoreUnexported(guard.State{})); diff != "" {
			t.Fatalf("step %d (%s): the claims told what changed differ from those given everything (-everything +changed):\n%s", step, what, diff)
		}
	}
	t.Logf("ClaimPortsChanged told %d of 250 steps", handled)
	if handled < 100 {
		t.Errorf("ClaimPortsChanged could tell %d times of 250: the changed path is hardly tested", handled)
	}
}

// learnedOrRefused has vm send from mac through port p-r, and waits until
// the port holds mac or the frame was dropped.
func learnedOrRefused(t *testing.T, ctx context.Context, host *testutil.NS, n *api.Network, state func() *guard.State, vm *testutil.RawSender, mac net.HardwareAddr) {
	t.Helper()
	drops := func() uint64 {
		var d map[string]uint64
		host.MustDo(t, func() (err error) { d, err = guard.Drops(ctx, n.ID, nil); return err })
		return d["p-r"]
	}
	before := drops()
	vm.Send(t, claimFrame(mac))
	testutil.Eventually(t, time.Minute, func() error {
		if got := state().Learned["p-r"]; got == mac.String() || drops() > before {
			return nil
		}
		return fmt.Errorf("p-r neither holds %s nor dropped its frame", mac)
	}, "p-r to learn or refuse %s", mac)
}
