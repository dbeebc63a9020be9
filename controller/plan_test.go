package controller

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/statedir"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

const planNetworks = `
vmnet:
  shared:
    subnet: 192.168.105.0/24
  host:
    mode: host
    subnet: 192.168.106.0/24
  unused:
    subnet: 192.168.120.0/24
`

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

func project(name, vms string) *statedir.Project {
	return &statedir.Project{Name: name, Files: []statedir.ProjectFile{{Path: name + ".yaml", Data: []byte(vms)}}}
}

const planVMs = `
vms:
  web:
    networks:
      - vmnet: shared
      - vmnet: host
  db:
    networks:
      - vmnet: shared
        ip: 192.168.105.20
`

func TestComputeDesiredKeepsOnlyUsedNetworks(t *testing.T) {
	d := desired(t, planNetworks, project("p", planVMs))
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
	nets, _ := api.LoadNetworks("networks.yaml", []byte(planNetworks))
	_, err := ComputeDesired(nets, []*statedir.Project{project("a", planVMs), project("b", "vms:\n  web:\n    networks: [{vmnet: shared}]\n")}, nil)
	if err == nil {
		t.Fatal("two projects defining VM web were accepted")
	}
}

func TestPlan(t *testing.T) {
	base := desired(t, planNetworks, project("p", planVMs))
	tests := []struct {
		name    string
		current *Desired
		desired *Desired
		summary string
	}{
		{"from nothing", nil, base, "Plan: 5 to create, 0 to change, 0 to replace, 0 to delete."},
		{"converged", base, desired(t, planNetworks, project("p", planVMs)), "No changes."},
		{"a change to a network no attachment uses", base, desired(t,
			planNetworks+"    leaseTime: 1h\n", // appended to unused: no change to used networks
			project("p", planVMs)), "No changes."},
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
`, project("p", // db moves to .21, cache is new
			strings.Replace(planVMs, "ip: 192.168.105.20", "ip: 192.168.105.21", 1)+"  cache:\n    networks:\n      - vmnet: shared\n")),
			"Plan: 1 to create, 2 to change, 2 to replace, 0 to delete."},
		{"ipv6 changes", base, desired(t, strings.Replace(strings.Replace(planNetworks,
			"    subnet: 192.168.105.0/24\n", "    subnet: 192.168.105.0/24\n    subnet6: fd00:105::/64\n", 1),
			"    subnet: 192.168.106.0/24\n", "    subnet: 192.168.106.0/24\n    ipv6: false\n", 1),
			project("p", planVMs)), "Plan: 0 to create, 0 to change, 5 to replace, 0 to delete."},
		// The shared network spans hosts: it and its 2 attachments are
		// replaced (a new tunnel, another DHCP slice).
		{"vxlan added", base, desired(t, strings.Replace(planNetworks,
			"    subnet: 192.168.105.0/24\n", "    subnet: 192.168.105.0/24\n    dhcpRange: {start: 192.168.105.50, end: 192.168.105.99}\n    mtu: 1400\n    vxlan: {vni: 5, hosts: [{name: a, address: 10.0.0.1}, {name: b, address: 10.0.0.2}]}\n", 1),
			project("p", planVMs)), "Plan: 0 to create, 0 to change, 3 to replace, 0 to delete."},
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

// TestUpgradeKeepsRunningMACs: attachments that run with the MACs an
// older vmnetctl derived (24 bits, api.LegacyMAC) keep them through an
// upgrade: the controller's pass keeps the MACs its helpers run with, so
// the plan restarts no helper and no VM's lease, name or TAP changes.
// Without the helpers' records (a fresh `up`), the new MACs apply.
func TestUpgradeKeepsRunningMACs(t *testing.T) {
	nets, diags := api.LoadNetworks("networks.yaml", []byte(planNetworks))
	if err := diags.Err(); err != nil {
		t.Fatal(err)
	}
	projects := []*statedir.Project{project("p", planVMs)}
	// What the older version applied: the same VMs with legacy MACs.
	applied := desired(t, planNetworks, projects...)
	var recs []statedir.HelperRecord
	for _, a := range applied.Attachments {
		a.MAC = api.LegacyMAC(a.VM, a.Index).String()
		recs = append(recs, statedir.HelperRecord{Key: a.Key(), Project: a.Project, MAC: a.MAC})
	}
	d, err := ComputeDesired(nets, projects, keptMACs(recs))
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

// TestOtherProjectsNamedAbsolute: a problem between the project of this
// command and a recorded one names this one's file as the user gave it,
// and the recorded one's by its absolute path when it was given relative
// (the user is not in the directory its `up` ran in).
func TestOtherProjectsNamedAbsolute(t *testing.T) {
	nets, _ := api.LoadNetworks("networks.yaml", []byte(planNetworks))
	rec := &statedir.Project{Name: "old", Files: []statedir.ProjectFile{{Path: "vms.yaml", Abs: "/home/u/old/vms.yaml", Data: []byte(planVMs)}}}
	mine := &statedir.Project{Name: "new", Files: []statedir.ProjectFile{{Path: "my/vms.yaml", Abs: "/srv/my/vms.yaml", Data: []byte("vms:\n  web:\n    networks: [{vmnet: shared}]\n")}}}
	l := &loaded{nets: nets}
	var diags api.Diagnostics
	l.project, diags = parseProject(mine)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	_, err := l.desiredWith(Env{}, []*statedir.Project{rec}, nil)
	if err == nil || !strings.Contains(err.Error(), "/home/u/old/vms.yaml") || !strings.Contains(err.Error(), "my/vms.yaml") || strings.Contains(err.Error(), "/srv/my/vms.yaml") {
		t.Errorf("the collision names %v; want /home/u/old/vms.yaml and my/vms.yaml as given", err)
	}
}
