package spec

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// resolverNetworks are a shared and a host network vmnetctl manages and
// one it does not (its entries skipped).
const resolverNetworks = `
networks:
  user-v2: {mode: user-v2, gateway: 192.168.104.1}
vmnet:
  shared: {subnet: 192.168.105.0/24}
  host: {mode: host, subnet: 192.168.106.0/24}
`

// TestResolverAsAll: the Resolver, pass after pass, gives what resolving
// every project at once (ComputeParsed) gives, through 600 random steps
// (projects that come, go, change, or are given again unchanged; MACs
// kept or not, kept at another MAC of their own or at one not theirs; VM
// names, set MACs (also on entries of a network vmnetctl does not
// manage), fixed addresses and forwarded host ports that two projects
// share; set MACs that are another entry's first derived one, so that it
// takes its second; a network kept up by a project), errors included, and
// never changes a Desired it gave before. Most passes are resolved by
// their changes alone.
func TestResolverAsAll(t *testing.T) {
	nets, diags := api.LoadNetworks("networks.yaml", []byte(resolverNetworks))
	if err := diags.Err(); err != nil {
		t.Fatal(err)
	}
	// Each entry's first derived MAC and its second (what it takes when
	// the first is taken), from resolving it beside a VM that sets the
	// first.
	first, second := map[string]string{}, map[string]string{}
	macs := func(vm string, i int) (string, string) {
		key := fmt.Sprintf("%s/%d", vm, i)
		if _, ok := first[key]; !ok {
			var b strings.Builder
			fmt.Fprintf(&b, "vms:\n  %s:\n    networks:\n", vm)
			for range i + 1 {
				b.WriteString("      - vmnet: shared\n")
			}
			first[key] = mustDesired(t, nets, b.String()).Attachments[i].MAC
			fmt.Fprintf(&b, "  zz:\n    networks:\n      - vmnet: host\n        macAddress: %q\n", first[key])
			second[key] = mustDesired(t, nets, b.String()).Attachments[i].MAC
			if second[key] == first[key] {
				t.Fatalf("%s: no second MAC", key)
			}
		}
		return first[key], second[key]
	}
	// Most VMs are their project's; a few names are shared, one of them
	// differing only in case.
	shared := []string{"a", "b", "B"}
	rng := rand.New(rand.NewPCG(1, 30))
	project := func(name string) *statedir.Project {
		var b strings.Builder
		b.WriteString("vms:\n")
		used := map[string]bool{}
		for range 1 + rng.IntN(3) {
			vm := fmt.Sprintf("%s-%d", name, rng.IntN(4))
			if rng.IntN(12) == 0 {
				vm = shared[rng.IntN(len(shared))]
			}
			if used[vm] {
				continue
			}
			used[vm] = true
			fmt.Fprintf(&b, "  %s:\n    networks:\n", vm)
			for i := range 1 + rng.IntN(2) {
				switch r := rng.IntN(20); {
				case r < 2:
					b.WriteString("      - lima: user-v2\n")
					if rng.IntN(3) == 0 {
						// The same MAC as one of a network vmnetctl
						// manages is no error.
						fmt.Fprintf(&b, "        macAddress: \"52:55:55:00:00:%02x\"\n", rng.IntN(4))
					}
					continue
				case r < 4:
					b.WriteString("      - vmnet: host\n")
				default:
					b.WriteString("      - vmnet: shared\n")
				}
				switch r := rng.IntN(40); {
				case r == 0:
					fmt.Fprintf(&b, "        macAddress: \"52:55:55:00:00:%02x\"\n", rng.IntN(4))
				case r == 1:
					// Another entry's first MAC: it takes its second.
					m, _ := macs(fmt.Sprintf("p%d-%d", rng.IntN(9), rng.IntN(4)), rng.IntN(2))
					fmt.Fprintf(&b, "        macAddress: %q\n", m)
				case r == 2:
					fmt.Fprintf(&b, "        ip: 192.168.10%d.%d\n", 5+rng.IntN(2), 10+rng.IntN(4))
				case r == 3:
					fmt.Fprintf(&b, "        portForwards:\n          - guestPort: 80\n            hostPort: %d\n", 8080+rng.IntN(3))
				}
				_ = i
			}
		}
		p := &statedir.Project{Name: name, Files: []statedir.ProjectFile{{Path: name + ".yaml", Data: []byte(b.String())}}}
		if rng.IntN(20) == 0 {
			p.Networks = []string{"host"}
		}
		if rng.IntN(20) == 0 {
			p.External = true
		}
		return p
	}
	current := map[string]*statedir.Project{}
	var rv Resolver
	var last *Desired
	var lastJSON string
	keep := map[string]string{}
	errs := 0
	for step := range 600 {
		switch r := rng.IntN(10); {
		case r < 4 || len(current) < 2:
			name := fmt.Sprintf("p%d", rng.IntN(9))
			current[name] = project(name)
		case r < 6:
			delete(current, slices.Sorted(maps.Keys(current))[rng.IntN(len(current))])
		case r < 8:
			// The same record, read again.
			name := slices.Sorted(maps.Keys(current))[rng.IntN(len(current))]
			cp := *current[name]
			current[name] = &cp
		}
		// The helpers that run: most of the last Desired's, some at their
		// second MAC, some gone.
		if last != nil && rng.IntN(3) == 0 {
			keep = map[string]string{}
			for _, a := range last.Attachments {
				switch r := rng.IntN(10); {
				case r < 7:
					keep[a.Key()] = a.MAC
				case r == 7 && a.MACDerived:
					_, keep[a.Key()] = macs(a.VM, a.Index)
				case r == 8:
					keep[a.Key()] = "52:55:55:00:ff:00" // not one of its own
				}
			}
		}
		var projects []*statedir.Project
		for _, name := range slices.Sorted(maps.Keys(current)) {
			projects = append(projects, current[name])
		}
		got, err := passAsAll(t, step, &rv, nets, projects, keep)
		if err != nil {
			errs++
			continue
		}
		if last != nil && desiredJSON(t, last) != lastJSON {
			t.Fatalf("step %d: the Desired of a pass before changed", step)
		}
		last, lastJSON = got, desiredJSON(t, got)
	}
	t.Logf("%d passes resolved by their changes, %d whole, %d errors", rv.Incremental, rv.Full, errs)
	if rv.Incremental < 200 {
		t.Errorf("%d of 600 passes resolved by their changes alone", rv.Incremental)
	}
}

// passAsAll is a pass of rv over projects, checked against resolving
// them all (ComputeParsed of a fresh parse): the same error, or the same
// Desired.
func passAsAll(t *testing.T, step int, rv *Resolver, nets *api.Networks, projects []*statedir.Project, keep map[string]string) (*Desired, error) {
	t.Helper()
	var fresh ParseCache
	parsed, pdiags := fresh.Parse(projects)
	want, wantErr := ComputeParsed(nets, parsed, pdiags, keep)
	got, err := rv.Resolve(nets, projects, keep)
	if fmt.Sprint(err) != fmt.Sprint(wantErr) {
		t.Fatalf("step %d: error %v, want %v", step, err, wantErr)
	}
	if wantErr == nil && desiredJSON(t, got) != desiredJSON(t, want) {
		t.Fatalf("step %d (%d by changes, %d whole): desired\n%s\nwant\n%s", step, rv.Incremental, rv.Full, desiredJSON(t, got), desiredJSON(t, want))
	}
	return got, err
}

func mustDesired(t *testing.T, nets *api.Networks, vms string) *Desired {
	t.Helper()
	var c ParseCache
	parsed, diags := c.Parse([]*statedir.Project{{Name: "x", Files: []statedir.ProjectFile{{Path: "x.yaml", Data: []byte(vms)}}}})
	d, err := ComputeParsed(nets, parsed, diags, nil)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func desiredJSON(t *testing.T, d *Desired) string {
	t.Helper()
	b, err := json.MarshalIndent(d, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestResolverFreesWhatWent: what a project that went took (its VM's
// name, fixed address, forwarded host port, MAC) is free for the next at
// once, each pass resolved by its changes alone; a project given again
// as it was, or run by `vmnetctl run` (External) where it was not, too.
func TestResolverFreesWhatWent(t *testing.T) {
	nets, diags := api.LoadNetworks("networks.yaml", []byte(resolverNetworks))
	if err := diags.Err(); err != nil {
		t.Fatal(err)
	}
	const x = "vms:\n  x:\n    networks:\n      - vmnet: shared\n        macAddress: \"52:55:55:00:00:01\"\n        ip: 192.168.105.10\n        portForwards:\n          - guestPort: 80\n            hostPort: 8080\n"
	p := func(name, vms string) *statedir.Project {
		return &statedir.Project{Name: name, Files: []statedir.ProjectFile{{Path: name + ".yaml", Data: []byte(vms)}}}
	}
	p1, p2, p3 := p("p1", x), p("p2", "vms:\n  y:\n    networks: [{vmnet: host}]\n"), p("p3", x)
	p2run := *p2
	p2run.External = true
	var rv Resolver
	for i, step := range [][]*statedir.Project{{p1}, {p1, p2}, {p2}, {p2, p3}, {&p2run, p3}, {&p2run, p("p3", x)}} {
		if _, err := passAsAll(t, i, &rv, nets, step, nil); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if rv.Full != 1 || rv.Incremental != i {
			t.Errorf("step %d: %d passes resolved whole, %d by their changes; want the first whole only", i, rv.Full, rv.Incremental)
		}
	}
}

// TestResolverSharedMACOfSkipped: a MAC set on an entry of a network
// vmnetctl does not manage and on one of a network it does is no error;
// once the first goes, an entry whose first derived MAC it is still takes
// its second, and another entry that sets it is still an error.
func TestResolverSharedMACOfSkipped(t *testing.T) {
	nets, diags := api.LoadNetworks("networks.yaml", []byte(resolverNetworks))
	if err := diags.Err(); err != nil {
		t.Fatal(err)
	}
	m := mustDesired(t, nets, "vms:\n  c:\n    networks: [{vmnet: shared}]\n").Attachments[0].MAC
	p := func(name, vms string) *statedir.Project {
		return &statedir.Project{Name: name, Files: []statedir.ProjectFile{{Path: name + ".yaml", Data: []byte(vms)}}}
	}
	a := p("a", fmt.Sprintf("vms:\n  a:\n    networks:\n      - lima: user-v2\n        macAddress: %q\n", m))
	b := p("b", fmt.Sprintf("vms:\n  b:\n    networks:\n      - vmnet: shared\n        macAddress: %q\n", m))
	c := p("c", "vms:\n  c:\n    networks:\n      - vmnet: shared\n")
	d := p("d", fmt.Sprintf("vms:\n  d:\n    networks:\n      - vmnet: shared\n        macAddress: %q\n", m))
	// (Which of a and b a map would have kept for the MAC is chance: try
	// it often.)
	for range 50 {
		var rv Resolver
		for i, step := range [][]*statedir.Project{{a, b}, {b}, {b, c}, {b}, {b, d}} {
			passAsAll(t, i, &rv, nets, step, nil)
		}
	}
}

// TestResolverKeepsNotItsOwn: a helper that runs with a MAC not one its
// entry derives (set before, or run's) leaves the entry its first, as
// resolving all does, pass after pass by the changes alone.
func TestResolverKeepsNotItsOwn(t *testing.T) {
	nets, diags := api.LoadNetworks("networks.yaml", []byte(resolverNetworks))
	if err := diags.Err(); err != nil {
		t.Fatal(err)
	}
	p := func(name, vms string) *statedir.Project {
		return &statedir.Project{Name: name, Files: []statedir.ProjectFile{{Path: name + ".yaml", Data: []byte(vms)}}}
	}
	x, y := p("x", "vms:\n  x:\n    networks: [{vmnet: shared}]\n"), p("y", "vms:\n  y:\n    networks: [{vmnet: shared}]\n")
	keep := map[string]string{"x/0": "52:55:55:00:ff:00"}
	var rv Resolver
	for i, step := range [][]*statedir.Project{{x}, {x, y}, {x}} {
		if _, err := passAsAll(t, i, &rv, nets, step, keep); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if rv.Full != 1 || rv.Incremental != i {
			t.Errorf("step %d: %d passes resolved whole, %d by their changes; want the first whole only", i, rv.Full, rv.Incremental)
		}
	}
}
