package guard

import (
	"context"
	"regexp"
	"testing"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/nettypes"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestImpairmentsAsWritten: impairments given again while their chains are
// as the last write left them are not written (the generation stands),
// though the rules' counters counted frames since (a port that loses all
// it is sent, and frames sent to it); chains changed behind their back
// are written again.
func TestImpairmentsAsWritten(t *testing.T) {
	host := testutil.NewNS(t, "gimp")
	n := testutil.Network("gimp", api.ModeShared, "10.200.15.0/24")
	ctx := context.Background()
	host.MustRun(t, "ip", "link", "add", "vmn-gimp", "type", "bridge")
	host.MustRun(t, "ip", "addr", "add", "10.200.15.1/24", "dev", "vmn-gimp")
	host.MustRun(t, "ip", "link", "add", "vmt-gimp", "master", "vmn-gimp", "type", "veth", "peer", "name", "q-gimp")
	for _, l := range []string{"vmn-gimp", "vmt-gimp", "q-gimp"} {
		host.MustRun(t, "ip", "link", "set", l, "up")
	}
	ps := []nettypes.PortImpairment{{Port: "vmt-gimp", Impairment: api.Impairment{LossToVM: api.LossScale}}}
	table := hostnet.TableName(n.ID)
	var gen uint32
	// set gives n ps, and tells whether that committed anything.
	set := func() (wrote bool) {
		t.Helper()
		host.MustDo(t, func() error {
			before, err := hostnet.NFTGeneration()
			if err != nil {
				return err
			}
			if err := SetImpairments(ctx, n, ps); err != nil {
				return err
			}
			gen, err = hostnet.NFTGeneration()
			wrote = gen != before
			return err
		})
		return wrote
	}
	host.MustDo(t, func() error { return EnsureTable(ctx, n) })
	if !set() {
		t.Fatal("the first impairments wrote nothing")
	}
	// Frames to the port, dropped and counted by its rule.
	host.Run(context.Background(), "ping", "-c", "3", "-i", "0.2", "-W", "1", "10.200.15.2")
	if out := host.MustRun(t, "nft", "list", "chain", "bridge", table, impairTo); !regexp.MustCompile(`counter packets [1-9]`).MatchString(out) {
		t.Fatalf("no frame counted by the impairment (the test proves nothing):\n%s", out)
	}
	if set() {
		t.Error("impairments given again as they were, their counters moved: written again")
	}
	host.MustRun(t, "nft", "flush", "chain", "bridge", table, impairTo)
	if !set() {
		t.Error("impairments whose rules were flushed: not written again")
	}
	if out := host.MustRun(t, "nft", "list", "chain", "bridge", table, impairTo); !regexp.MustCompile(`oifname "vmt-gimp" counter packets \d+ bytes \d+ drop`).MatchString(out) {
		t.Errorf("the impairment's rule not put back:\n%s", out)
	}
	ps[0].LossToVM = api.LossScale / 2
	if !set() {
		t.Error("impairments changed: not written")
	}
}
