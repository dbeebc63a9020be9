package spec

import (
	"bytes"
	"fmt"
	"github.com/google/go-cmp/cmp"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/spec/spectest"
	"github.com/vmnetctl/vmnetctl/statedir"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

func TestComputeDesiredKeepsOnlyUsedNetworks(t *testing.T) {
	d := desired(t, spectest.Networks, spectest.Project("p", spectest.VMs))
	var ids []string
	for _, n := range d.Networks {
		ids = append(ids, n.ID)
	}
	if len(ids) != 2 || ids[0] != "host" || ids[1] != "shared" {
		t.Errorf("networks = %v, want [host shared]", ids)
	}
	if len(d.Attachments) != 3 || d.Attachments[0].Key() != "db/0" || d.Attachments[0].Project != "p" {
		t.Errorf("attachments = %+v", d.Attachments)
	}
}

func TestComputeDesiredRejectsCollisionsAcrossProjects(t *testing.T) {
	nets, _ := api.LoadNetworks("networks.yaml", []byte(spectest.Networks))
	_, err := ComputeDesired(nets, []*statedir.Project{spectest.Project("a", spectest.VMs), spectest.Project("b", "vms:\n  web:\n    networks: [{vmnet: shared}]\n")}, nil)
	if err == nil {
		t.Fatal("two projects defining VM web were accepted")
	}
}

func TestPlan(t *testing.T) {
	base := desired(t, spectest.Networks, spectest.Project("p", spectest.VMs))
	tests := []struct {
		name    string
		current *Desired
		desired *Desired
		summary string
	}{
		{"from nothing", nil, base, "Plan: 5 to create, 0 to change, 0 to replace, 0 to delete."},
		{"converged", base, desired(t, spectest.Networks, spectest.Project("p", spectest.VMs)), "No changes."},
		{"a change to a network no attachment uses", base, desired(t,
			spectest.Networks+"    leaseTime: 1h\n", // appended to unused: no change to used networks
			spectest.Project("p", spectest.VMs)), "No changes."},
		{"edits", base, desired(t, `
vmnet:
  shared:
    subnet: 192.168.105.0/24
    leaseTime: 1h
    reservations:
      "52:55:55:00:00:07": 192.168.105.7
  host:
    mode: host
    subnet: 192.168.116.0/24
`, spectest.Project("p", // db moves to .21, cache is new
			strings.Replace(spectest.VMs, "ip: 192.168.105.20", "ip: 192.168.105.21", 1)+"  cache:\n    networks:\n      - vmnet: shared\n")),
			"Plan: 1 to create, 2 to change, 2 to replace, 0 to delete."},
		{"ipv6 changes", base, desired(t, strings.Replace(strings.Replace(spectest.Networks,
			"    subnet: 192.168.105.0/24\n", "    subnet: 192.168.105.0/24\n    subnet6: fd00:105::/64\n", 1),
			"    subnet: 192.168.106.0/24\n", "    subnet: 192.168.106.0/24\n    ipv6: false\n", 1),
			spectest.Project("p", spectest.VMs)), "Plan: 0 to create, 0 to change, 5 to replace, 0 to delete."},
		// The shared network spans hosts: it and its 2 attachments are
		// replaced (a new tunnel, another DHCP slice).
		{"vxlan added", base, desired(t, strings.Replace(spectest.Networks,
			"    subnet: 192.168.105.0/24\n", "    subnet: 192.168.105.0/24\n    dhcpRange: {start: 192.168.105.50, end: 192.168.105.99}\n    mtu: 1400\n    vxlan: {vni: 5, hosts: [{name: a, address: 10.0.0.1}, {name: b, address: 10.0.0.2}]}\n", 1),
			spectest.Project("p", spectest.VMs)), "Plan: 0 to create, 0 to change, 3 to replace, 0 to delete."},
		{"everything removed", base, &Desired{}, "Plan: 0 to create, 0 to change, 0 to replace, 5 to delete."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := ComputePlan(tt.current, tt.desired)
			if got := p.Summary(); got != tt.summary {
				t.Errorf("summary = %q, want %q", got, tt.summary)
			}
			var out bytes.Buffer
			p.Render(&out)
			testutil.Golden(t, filepath.Join("testdata", "plan-"+strings.ReplaceAll(tt.name, " ", "-")+".txt"), out.String())
		})
	}
}

// TestPlanSameAttachments: the same attachments (pointers: what the
// Resolver gives again for projects that did not change) are no change,
// but replaced with the network they are on.
func TestPlanSameAttachments(t *testing.T) {
	base := desired(t, spectest.Networks, spectest.Project("p", spectest.VMs))
	if got := ComputePlan(base, &Desired{Networks: base.Networks, Attachments: slices.Clone(base.Attachments)}).Summary(); got != "No changes." {
		t.Errorf("the same attachments: %q", got)
	}
	ipv6 := desired(t, strings.Replace(spectest.Networks, "    subnet: 192.168.105.0/24\n", "    subnet: 192.168.105.0/24\n    subnet6: fd00:105::/64\n", 1),
		spectest.Project("p", spectest.VMs))
	same := &Desired{Networks: ipv6.Networks, Attachments: slices.Clone(base.Attachments)}
	if got, want := ComputePlan(base, same).Summary(), ComputePlan(base, ipv6).Summary(); got != want || want == "No changes." {
		t.Errorf("the same attachments, their network replaced: %q, want %q", got, want)
	}
}

// TestUpgradeKeepsRunningMACs: attachments that run with the MACs an
// older vmnetctl derived (24 bits, api.LegacyMAC) keep them through an
// upgrade: the controller's pass keeps the MACs its helpers run with, so
// the plan restarts no helper and no VM's lease, name or TAP changes.
// Without the helpers' records (a fresh `up`), the new MACs apply.
func TestUpgradeKeepsRunningMACs(t *testing.T) {
	nets, diags := api.LoadNetworks("networks.yaml", []byte(spectest.Networks))
	if err := diags.Err(); err != nil {
		t.Fatal(err)
	}
	projects := []*statedir.Project{spectest.Project("p", spectest.VMs)}
	// What the older version applied: the same VMs with legacy MACs.
	applied := desired(t, spectest.Networks, projects...)
	var recs []statedir.HelperRecord
	for _, a := range applied.Attachments {
		a.MAC = api.LegacyMAC(a.VM, a.Index).String()
		recs = append(recs, statedir.HelperRecord{Key: a.Key(), Project: a.Project, MAC: a.MAC})
	}
	d, err := ComputeDesired(nets, projects, KeptMACs(recs))
	if err != nil {
		t.Fatal(err)
	}
	if plan := ComputePlan(applied, d); !plan.Empty() {
		t.Errorf("after an upgrade, with the helpers running: %+v", plan)
	}
	fresh, err := ComputeDesired(nets, projects, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range fresh.Attachments {
		if a.MAC != api.DeriveMAC(a.VM, a.Index).String() {
			t.Errorf("%s on a fresh up: MAC %s, want the 40-bit %s", a.Key(), a.MAC, api.DeriveMAC(a.VM, a.Index))
		}
	}
}

func desired(t *testing.T, networks string, projects ...*statedir.Project) *Desired {
	t.Helper()
	nets, diags := api.LoadNetworks("networks.yaml", []byte(networks))
	if err := diags.Err(); err != nil {
		t.Fatal(err)
	}
	d, err := ComputeDesired(nets, projects, nil)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestPlanInOrderAsByKey: a plan of two desired states in Resolve's
// order (walked side by side) is the plan of the same states in any
// order (matched by key): 200 random pairs of states, VMs coming,
// going and changing, with names whose keys sort otherwise than they
// (a/0 after a-b/0).
func TestPlanInOrderAsByKey(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	names := []string{"a", "a-b", "a.b", "ab", "b", "b0", "b_1", "c"}
	state := func() *Desired {
		d := &Desired{}
		for _, vm := range names {
			for i := range rng.IntN(3) {
				a := &Attachment{Attachment: &api.Attachment{VM: vm, Index: i, Network: []string{"shared", "host"}[rng.IntN(2)],
					MAC: fmt.Sprintf("52:00:00:00:00:%02x", rng.IntN(4))}, Project: "p"}
				d.Attachments = append(d.Attachments, a)
			}
		}
		return d
	}
	for range 200 {
		old, now := state(), state()
		got := ComputePlan(old, now)
		shuffled := func(d *Desired) *Desired {
			c := &Desired{Attachments: slices.Clone(d.Attachments)}
			rng.Shuffle(len(c.Attachments), func(i, j int) { c.Attachments[i], c.Attachments[j] = c.Attachments[j], c.Attachments[i] })
			return c
		}
		want := ComputePlan(shuffled(old), shuffled(now))
		if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b *Attachment) bool { return a == b })); diff != "" {
			t.Fatalf("the plan walked in order differs from the plan by key (-by key +in order):\n%s", diff)
		}
	}
}
