package spec

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/spec/spectest"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// BenchmarkResolveFleet is what every pass of the controller pays to know
// the desired state with a fleet of 999 VMs recorded and parsed (the
// parse cache hit): resolving them all, and a project of one VM beside.
func BenchmarkResolveFleet(b *testing.B) {
	nets, vms := fleetOf999(b)
	var cache ParseCache
	projects := []*statedir.Project{spectest.Project("fleet", vms), spectest.Project("one", "vms:\n  solo:\n    networks: [{vmnet: fleet0}]\n")}
	parsed, pdiags := cache.Parse(projects)
	b.ResetTimer()
	for b.Loop() {
		if _, err := ComputeParsed(nets, parsed, pdiags, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPlanFleet is a pass's plan when one VM joins 999 that run.
func BenchmarkPlanFleet(b *testing.B) {
	nets, vms := fleetOf999(b)
	fleet := spectest.Project("fleet", vms)
	before, err := ComputeDesired(nets, []*statedir.Project{fleet}, nil)
	if err != nil {
		b.Fatal(err)
	}
	after, err := ComputeDesired(nets, []*statedir.Project{fleet, spectest.Project("one", "vms:\n  solo:\n    networks: [{vmnet: fleet0}]\n")}, nil)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if p := ComputePlan(before, after); len(p.Attachments) != 1 {
			b.Fatalf("plan %+v", p.Attachments)
		}
	}
}

// BenchmarkParseProjects is a pass's parse, from its cache, of 1,000
// projects of one VM that did not change (the records the projects'
// reader gives again).
func BenchmarkParseProjects(b *testing.B) {
	projects := oneVMProjects(1000)
	var cache ParseCache
	cache.Parse(projects)
	for b.Loop() {
		if parsed, _ := cache.Parse(projects); len(parsed) != 1000 {
			b.Fatal(len(parsed))
		}
	}
}

// BenchmarkDesiredPass is the desired step of a pass with a fleet of 999
// VMs that run (their MACs kept) and a project of one VM beside, as the
// controller takes it: the projects from the parse cache, resolved.
func BenchmarkDesiredPass(b *testing.B) {
	nets, vms := fleetOf999(b)
	benchDesiredPass(b, nets, []*statedir.Project{spectest.Project("fleet", vms), spectest.Project("one", "vms:\n  solo:\n    networks: [{vmnet: fleet0}]\n")})
}

// benchDesiredPass is the desired step of a pass over projects whose
// VMs run (their MACs kept), from the parse cache, all resolved.
func benchDesiredPass(b *testing.B, nets *api.Networks, projects []*statedir.Project) {
	var cache ParseCache
	parsed, pdiags := cache.Parse(projects)
	first, err := ComputeParsed(nets, parsed, pdiags, nil)
	if err != nil {
		b.Fatal(err)
	}
	keep := map[string]string{}
	for _, a := range first.Attachments {
		keep[a.Key()] = a.MAC
	}
	for b.Loop() {
		parsed, pdiags := cache.Parse(projects)
		if d, err := ComputeParsed(nets, parsed, pdiags, keep); err != nil || len(d.Attachments) != len(first.Attachments) {
			b.Fatal(err)
		}
	}
}

// oneVMProjects are n projects of one VM on fleet0 each.
func oneVMProjects(n int) []*statedir.Project {
	var projects []*statedir.Project
	for i := range n {
		projects = append(projects, spectest.Project(fmt.Sprintf("p%04d", i), fmt.Sprintf("vms:\n  v%04d:\n    networks: [{vmnet: fleet0}]\n", i)))
	}
	return projects
}

// fleetOf999 is a network of 1,022 addresses and the VM file of a fleet
// of 999 VMs on it.
func fleetOf999(b *testing.B) (*api.Networks, string) {
	b.Helper()
	nets, diags := api.LoadNetworks("networks.yaml", []byte("vmnet:\n  fleet0:\n    subnet: 10.96.0.0/22\n"))
	if err := diags.Err(); err != nil {
		b.Fatal(err)
	}
	var vms strings.Builder
	vms.WriteString("vms:\n")
	for i := range 999 {
		fmt.Fprintf(&vms, "  c%05d:\n    networks: [{vmnet: fleet0}]\n", i)
	}
	return nets, vms.String()
}

// BenchmarkDesiredPassProjects is the desired step of a pass with 1,000
// projects of one VM that run (their MACs kept), as a fleet attached
// through the projects' API is: the projects from the parse cache,
// resolved.
func BenchmarkDesiredPassProjects(b *testing.B) {
	nets, _ := fleetOf999(b)
	benchDesiredPass(b, nets, oneVMProjects(1000))
}

// BenchmarkResolverAttach is the desired step of an attach and of a
// detach through the projects' API beside 1,000 projects of one VM that
// run (their MACs kept): the Resolver, two passes an iteration. (999
// and one: a network holds 1,000.)
func BenchmarkResolverAttach(b *testing.B) {
	nets, _ := fleetOf999(b)
	projects := oneVMProjects(999)
	var rv Resolver
	first, err := rv.Resolve(nets, projects, nil)
	if err != nil {
		b.Fatal(err)
	}
	keep := map[string]string{}
	for _, a := range first.Attachments {
		keep[a.Key()] = a.MAC
	}
	with := append(slices.Clone(projects), spectest.Project("zz-one", "vms:\n  solo:\n    networks: [{vmnet: fleet0}]\n"))
	for b.Loop() {
		if d, err := rv.Resolve(nets, with, keep); err != nil || len(d.Attachments) != 1000 {
			b.Fatal(err)
		}
		if d, err := rv.Resolve(nets, projects, keep); err != nil || len(d.Attachments) != 999 {
			b.Fatal(err)
		}
	}
	if rv.Full != 1 {
		b.Errorf("%d passes resolved whole", rv.Full)
	}
}
