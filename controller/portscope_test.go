package controller

import (
	"context"
	"slices"
	"testing"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/backend"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// portsBackend records the networks whose ports EnsurePorts is given (the
// rest of the interface is nil: ensurePorts calls nothing else).
type portsBackend struct {
	backend.Backend
	checked []string
}

func (b *portsBackend) EnsurePorts(_ context.Context, n *api.Network, ports []backend.Port) error {
	b.checked = append(b.checked, n.ID)
	return nil
}

// TestPortScope: a full pass checks the ports of every running network; a
// pass asked for (up, down) only those of the networks the plan changed or
// the pass started or repaired, so that one VM's attach does not read the
// thousand ports of a network it left alone.
func TestPortScope(t *testing.T) {
	nets := []*api.Network{{ID: "a"}, {ID: "b"}, {ID: "c"}}
	desired := &Desired{Networks: nets}
	c := &Controller{nets: map[string]backend.Network{}, helpers: map[string]*helperProc{}}
	for i, n := range nets {
		a := &Attachment{Attachment: &api.Attachment{VM: "vm-" + n.ID, Network: n.ID, MAC: "52:55:55:00:00:0" + string(rune('1'+i)), MACDerived: true}}
		desired.Attachments = append(desired.Attachments, a)
		c.helpers[a.Key()] = &helperProc{state: StateRunning, rec: statedir.HelperRecord{Tap: "vmt-" + n.ID}}
	}
	for _, n := range nets {
		c.nets[n.ID] = runningNetwork{}
	}
	plan := &Plan{Networks: []NetworkChange{{ID: "b", Action: ActionUpdate}}}
	for _, tc := range []struct {
		name  string
		full  bool
		later []string // started or repaired by the pass
		want  []string
	}{
		{"full", true, nil, []string{"a", "b", "c"}},
		{"asked for", false, nil, []string{"b"}},
		{"asked for, one repaired", false, []string{"c"}, []string{"b", "c"}},
	} {
		be := &portsBackend{}
		c.be = be
		scope := newPortScope(plan, tc.full)
		for _, id := range tc.later {
			scope.add(id)
		}
		if errs := c.ensurePorts(context.Background(), desired, scope); len(errs) > 0 {
			t.Fatal(errs)
		}
		if !slices.Equal(be.checked, tc.want) {
			t.Errorf("%s: ports checked on %v, want %v", tc.name, be.checked, tc.want)
		}
	}
}

// runningNetwork stands for a network that runs (ensurePorts only asks
// whether there is one).
type runningNetwork struct{ backend.Network }

// TestDesiredOfProject: the part of the desired state `up` of one project
// prints: its attachments, the networks they use and those it keeps up,
// nothing of the other projects'.
func TestDesiredOfProject(t *testing.T) {
	d := &Desired{Networks: []*api.Network{{ID: "a"}, {ID: "b"}, {ID: "kept"}, {ID: "other"}}}
	for _, a := range []struct{ vm, network, project string }{{"x", "a", "p"}, {"y", "b", "p"}, {"z", "other", "q"}} {
		d.Attachments = append(d.Attachments, &Attachment{Attachment: &api.Attachment{VM: a.vm, Network: a.network}, Project: a.project})
	}
	projects := []*statedir.Project{{Name: "p", Networks: []string{"kept"}}, {Name: "q"}}
	got := d.ofProject("p", projects)
	var nets, vms []string
	for _, n := range got.Networks {
		nets = append(nets, n.ID)
	}
	for _, a := range got.Attachments {
		vms = append(vms, a.VM)
	}
	if !slices.Equal(nets, []string{"a", "b", "kept"}) || !slices.Equal(vms, []string{"x", "y"}) {
		t.Errorf("project p's part: networks %v, VMs %v", nets, vms)
	}
	if got := d.ofProject("nobody", projects); len(got.Networks)+len(got.Attachments) != 0 {
		t.Errorf("a project that is not there: %+v", got)
	}
}
