package netplane

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/backend"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestVMEgressKeptAcrossRebuild: the network's table is built again (a
// Start after a controller restart, a repair) with the VMs' own policies
// as they were, in the same transaction: a VM is never, for a moment,
// under its network's policy instead of its own.
func TestVMEgressKeptAcrossRebuild(t *testing.T) {
	needRoot(t)
	host := testutil.NewNS(t, "ek-host")
	n := testNet("ek", api.ModeShared, "10.9.10.0/24")
	nw := start(t, host, n, Options{StateDir: t.TempDir(), Upstreams: []string{"127.0.0.1:53"}})
	mac := mustMAC("52:55:55:00:0a:01")
	ip := netip.MustParseAddr("10.9.10.50")
	if err := nw.SetHost(mac, "p", ip); err != nil {
		t.Fatal(err)
	}
	if err := nw.SetVMEgress(context.Background(), []backend.VMEgress{{MAC: mac.String(), Egress: &api.Egress{DefaultAllow: false}}}); err != nil {
		t.Fatal(err)
	}
	own := func() string {
		return host.MustRun(t, "nft", "list", "set", "inet", TableName(n.ID), egressOwn4)
	}
	if out := own(); !strings.Contains(out, ip.String()) {
		t.Fatalf("the VM's own policy is not in force:\n%s", out) // the control
	}
	mustDo(t, host, func() error { return ensureTable(context.Background(), n) })
	if out := own(); !strings.Contains(out, ip.String()) {
		t.Errorf("the table was built again without the VM's own policy:\n%s", out)
	}
	if out := host.MustRun(t, "nft", "list", "map", "inet", TableName(n.ID), egressVM4); !strings.Contains(out, ip.String()) {
		t.Errorf("the VM's map was not kept:\n%s", out)
	}
	nw.Close()
}
