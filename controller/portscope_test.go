package controller

import (
	"context"
	"errors"
	"maps"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/backend"
	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/spec"
	"github.com/vmnetctl/vmnetctl/spec/spectest"
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
	c, desired := runningPorts("a", "b", "c")
	plan := &spec.Plan{Networks: []spec.NetworkChange{{ID: "b", Action: spec.ActionUpdate}}}
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

// runningPorts is a controller running the networks ids, each with a
// VM whose helper runs (its port a TAP), and the desired state of them.
func runningPorts(ids ...string) (*Controller, *spec.Desired) {
	desired := &spec.Desired{}
	c := &Controller{nets: map[string]backend.Network{}, helpers: map[string]*helperProc{}}
	for i, id := range ids {
		desired.Networks = append(desired.Networks, &api.Network{ID: id})
		a := &spec.Attachment{Attachment: &api.Attachment{VM: "vm-" + id, Network: id, MAC: "52:55:55:00:00:0" + string(rune('1'+i)), MACDerived: true}}
		desired.Attachments = append(desired.Attachments, a)
		c.helpers[a.Key()] = &helperProc{state: ctlapi.StateRunning, rec: statedir.HelperRecord{Tap: "vmt-" + id}}
		c.nets[id] = runningNetwork{}
	}
	return c, desired
}

// TestDesiredOfProject: the part of the desired state `up` of one project
// prints: its attachments, the networks they use and those it keeps up,
// nothing of the other projects'.
func TestDesiredOfProject(t *testing.T) {
	d := &spec.Desired{Networks: []*api.Network{{ID: "a"}, {ID: "b"}, {ID: "kept"}, {ID: "other"}}}
	for _, a := range []struct{ vm, network, project string }{{"x", "a", "p"}, {"y", "b", "p"}, {"z", "other", "q"}} {
		d.Attachments = append(d.Attachments, &spec.Attachment{Attachment: &api.Attachment{VM: a.vm, Network: a.network}, Project: a.project})
	}
	projects := []*statedir.Project{{Name: "p", Networks: []string{"kept"}}, {Name: "q"}}
	got := d.OfProject("p", projects)
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
	if got := d.OfProject("nobody", projects); len(got.Networks)+len(got.Attachments) != 0 {
		t.Errorf("a project that is not there: %+v", got)
	}
}

// TestParseCache: the controller's passes parse a project again only when
// its files change, and each pass resolves copies (Resolve moves entries
// and assigns MACs in what it is given): the same desired state pass
// after pass, an entry skipped for its network back once networks.yaml
// makes that network one vmnetctl manages, a changed file's VMs at once,
// a removed project gone.
func TestParseCache(t *testing.T) {
	nets, diags := api.LoadNetworks("networks.yaml", []byte("networks:\n  user-v2: {mode: user-v2, gateway: 192.168.104.1}\n  shared: {mode: shared, gateway: 192.168.105.1}\n  host: {mode: host, gateway: 192.168.106.1}\n"))
	if err := diags.Err(); err != nil {
		t.Fatal(err)
	}
	// web's second entry is a network vmnetctl does not manage: Resolve
	// moves it to Skipped, in the files it resolves.
	fleet := spectest.Project("fleet", "vms:\n  web:\n    networks:\n      - vmnet: shared\n      - lima: user-v2\n  db:\n    networks: [{vmnet: host}]\n")
	one := spectest.Project("one", "vms:\n  solo:\n    networks: [{vmnet: shared}]\n")
	var c spec.ParseCache
	pass := func(projects ...*statedir.Project) *spec.Desired {
		t.Helper()
		parsed, diags := c.Parse(projects)
		d, err := spec.ComputeParsed(nets, parsed, diags, nil)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	want, err := spec.ComputeDesired(nets, []*statedir.Project{fleet, one}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if diff := cmp.Diff(want, pass(fleet, one), cmpopts.IgnoreUnexported(api.Attachment{}, api.Network{}), cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{})); diff != "" {
			t.Fatalf("pass %d differs from a fresh parse (-want +got):\n%s", i, diff)
		}
	}
	// networks.yaml changes, the files do not: web's second entry is now
	// a network vmnetctl manages, and comes back from Skipped.
	nets2, diags := api.LoadNetworks("networks.yaml", []byte("networks:\n  user-v2: {mode: shared, gateway: 192.168.104.1}\n  shared: {mode: shared, gateway: 192.168.105.1}\n  host: {mode: host, gateway: 192.168.106.1}\n"))
	if err := diags.Err(); err != nil {
		t.Fatal(err)
	}
	parsed, pdiags := c.Parse([]*statedir.Project{fleet, one})
	d2, err := spec.ComputeParsed(nets2, parsed, pdiags, nil)
	if err != nil {
		t.Fatal(err)
	}
	webs := 0
	for _, a := range d2.Attachments {
		if a.VM == "web" {
			webs++
		}
	}
	if webs != 2 || len(d2.Skipped) != 0 {
		t.Errorf("after networks.yaml made web's second network one vmnetctl manages: %d attachments of web, skipped %v", webs, d2.Skipped)
	}
	before := c["fleet"].Files[0]
	one2 := spectest.Project("one", "vms:\n  solo:\n    networks: [{vmnet: host}]\n")
	d := pass(fleet, one2)
	if c["fleet"].Files[0] != before {
		t.Error("fleet, unchanged, was parsed again")
	}
	// Its record read again (another value, the same files): not parsed
	// again either.
	pass(spectest.Project("fleet", "vms:\n  web:\n    networks:\n      - vmnet: shared\n      - lima: user-v2\n  db:\n    networks: [{vmnet: host}]\n"), one2)
	if c["fleet"].Files[0] != before {
		t.Error("fleet, its record read again unchanged, was parsed again")
	}
	var solo *spec.Attachment
	for _, a := range d.Attachments {
		if a.VM == "solo" {
			solo = a
		}
	}
	if solo == nil || solo.Network != "host" {
		t.Errorf("solo after its file changed: %+v", solo)
	}
	pass(fleet)
	if _, ok := c["one"]; ok || len(c) != 1 {
		t.Errorf("the cache after one went: %v", slices.Collect(maps.Keys(c)))
	}
}

// checksBackend records the networks CheckNetwork is asked about, all of
// them as configured.
type checksBackend struct {
	backend.Backend
	checked []string
}

func (b *checksBackend) CheckNetwork(_ context.Context, n *api.Network, _ backend.NetworkOptions) error {
	b.checked = append(b.checked, n.ID)
	return nil
}

// healthyNetwork stands for a network whose services run.
type healthyNetwork struct{ backend.Network }

func (healthyNetwork) Health() error { return nil }

// TestCheckScope: a full pass checks every running network for drift
// (its ports settled or not: sysctls, routes and FRR send no notice), and
// so does a pass asked for that changes nothing (`up` run again to put
// things right); a pass asked for that attaches or detaches VMs checks
// none, so that a fleet's VM does not pay an nft run per network.
func TestCheckScope(t *testing.T) {
	nets := []*api.Network{{ID: "a"}, {ID: "b"}, {ID: "c"}}
	desired := &spec.Desired{Networks: nets}
	c := &Controller{nets: map[string]backend.Network{}, degraded: map[string]string{}, repairRetry: map[string]*repairRetry{}, netErrs: map[string]string{}, repairs: map[string]uint64{}}
	for _, n := range nets {
		c.nets[n.ID] = healthyNetwork{}
	}
	attach := &spec.Plan{Attachments: []spec.AttachmentChange{
		{Action: spec.ActionCreate, Key: "p/vm/b", New: &spec.Attachment{Attachment: &api.Attachment{VM: "vm", Network: "b"}}},
	}}
	for _, tc := range []struct {
		name    string
		plan    *spec.Plan
		full    bool
		settled bool // its ports settled (settled)
		want    []string
	}{
		{"full", attach, true, false, []string{"a", "b", "c"}},
		{"full, the ports settled", attach, true, true, []string{"a", "b", "c"}},
		{"asked for, nothing to change", &spec.Plan{}, false, false, []string{"a", "b", "c"}},
		{"asked for, a VM attached", attach, false, false, nil},
	} {
		be := &checksBackend{}
		c.be = be
		scope := newPortScope(tc.plan, tc.full)
		if tc.settled {
			scope.settle()
		}
		if errs := c.repairNetworks(context.Background(), tc.plan, desired, scope); len(errs) > 0 {
			t.Fatal(errs)
		}
		if !slices.Equal(be.checked, tc.want) {
			t.Errorf("%s: networks checked %v, want %v", tc.name, be.checked, tc.want)
		}
	}
}

// TestExitKicks: a helper that exits on its own asks for a pass (it is
// restarted); one the controller stopped does not: the pass that stopped
// it was the one that mattered, and a fleet's detach would otherwise cost
// a second pass over every VM.
func TestExitKicks(t *testing.T) {
	for _, stopped := range []bool{false, true} {
		c := &Controller{kickc: make(chan struct{}, 1)}
		h := &helperProc{exited: closedChan()}
		h.stopped.Store(stopped)
		c.exited(h)
		if kicked := len(c.kickc) == 1; kicked == stopped {
			t.Errorf("helper stopped by the controller: %v; its exit asked for a pass: %v", stopped, kicked)
		}
	}
}

// claimsBackend records the options and the attachments ClaimPorts is
// given, by network, and fails on the networks in fail.
type claimsBackend struct {
	backend.Backend
	opts map[string]backend.ClaimOptions
	atts map[string][]string
	fail map[string]bool
}

func (b *claimsBackend) ClaimPorts(_ context.Context, n *api.Network, atts []*api.Attachment, o backend.ClaimOptions) error {
	b.opts[n.ID] = o
	b.atts[n.ID] = nil
	for _, a := range atts {
		b.atts[n.ID] = append(b.atts[n.ID], a.Key())
	}
	if b.fail[n.ID] {
		return errors.New("refused")
	}
	return nil
}

// TestGonePortsClaimed: the next claims of a network whose helpers went
// are told those ports by their TAPs' indexes (the guard looks at them
// alone, whatever the network's size); a helper whose record has no index
// (an older vmnetctl's) makes them look at every port; once claimed, a
// network is told of none.
func TestGonePortsClaimed(t *testing.T) {
	nets := []*api.Network{{ID: "a"}, {ID: "b"}, {ID: "c"}}
	be := &claimsBackend{opts: map[string]backend.ClaimOptions{}, atts: map[string][]string{}}
	c := &Controller{be: be, nets: map[string]backend.Network{}}
	for _, n := range nets {
		c.nets[n.ID] = runningNetwork{}
	}
	c.markPortGone(statedir.HelperRecord{Network: "a", TapIndex: 7})
	c.markPortGone(statedir.HelperRecord{Network: "a", TapIndex: 9})
	c.markPortGone(statedir.HelperRecord{Network: "b", TapIndex: 8})
	c.markPortGone(statedir.HelperRecord{Network: "b"})
	desired := &spec.Desired{Networks: nets}
	claim := func() {
		t.Helper()
		// (A plan that changes something, elsewhere: the claims are not
		// read again.)
		plan := &spec.Plan{Networks: []spec.NetworkChange{{ID: "elsewhere", Action: spec.ActionCreate}}}
		if errs := c.claimPorts(context.Background(), desired, plan, newPortScope(plan, false)); len(errs) > 0 {
			t.Fatal(errs)
		}
	}
	claim()
	want := map[string]backend.ClaimOptions{"a": {GonePorts: []uint32{7, 9}}, "b": {PortsGone: true, GonePorts: []uint32{8}}, "c": {}}
	if d := cmp.Diff(want, be.opts, cmpopts.EquateEmpty()); d != "" {
		t.Errorf("claims told (-want +got):\n%s", d)
	}
	clear(be.opts)
	c.markPortGone(statedir.HelperRecord{Network: "c", TapIndex: 3})
	claim()
	if d := cmp.Diff(map[string]backend.ClaimOptions{"c": {GonePorts: []uint32{3}}}, be.opts, cmpopts.EquateEmpty()); d != "" {
		t.Errorf("the next claims told (-want +got):\n%s", d)
	}
}

// TestClaimsOfChangedNetworks: a pass claims on the networks whose
// attachments its plan changes, those whose ports went, those it reads
// again (a full pass, one that changes nothing, a network started or
// repaired) and those whose last claims failed; each with all of its
// attachments. The others are not asked: one VM's attach costs its own
// network's claims.
func TestClaimsOfChangedNetworks(t *testing.T) {
	nets := []*api.Network{{ID: "a"}, {ID: "b"}, {ID: "c"}}
	be := &claimsBackend{opts: map[string]backend.ClaimOptions{}, atts: map[string][]string{}, fail: map[string]bool{}}
	c := &Controller{be: be, nets: map[string]backend.Network{}}
	for _, n := range nets {
		c.nets[n.ID] = runningNetwork{}
	}
	att := func(vm, nw string) *spec.Attachment {
		return &spec.Attachment{Attachment: &api.Attachment{VM: vm, Network: nw}}
	}
	desired := &spec.Desired{Networks: nets, Attachments: []*spec.Attachment{att("a1", "a"), att("a2", "a"), att("b1", "b"), att("c1", "c")}}
	change := &spec.Plan{Attachments: []spec.AttachmentChange{{Action: spec.ActionCreate, Key: "a2/0", New: att("a2", "a")}}}
	pass := func(plan *spec.Plan, full bool, touched ...string) (map[string][]string, error) {
		t.Helper()
		clear(be.opts)
		clear(be.atts)
		scope := newPortScope(plan, full)
		for _, id := range touched {
			scope.add(id)
		}
		return be.atts, errors.Join(c.claimPorts(context.Background(), desired, plan, scope)...)
	}
	all := map[string][]string{"a": {"a1/0", "a2/0"}, "b": {"b1/0"}, "c": {"c1/0"}}
	be.fail["b"] = true
	if got, err := pass(change, false); err == nil || !cmp.Equal(got, all) {
		t.Fatalf("the first pass (b refused) claimed %v, %v; want every network's", got, err)
	}
	be.fail["b"] = false
	// toldChanges are the networks that were told what changed (and
	// may change only that), with what they were told.
	toldChanges := func() map[string][]string {
		out := map[string][]string{}
		for id, o := range be.opts {
			if ch := o.Changed; ch != nil {
				for _, a := range ch.Added {
					out[id] = append(out[id], "+"+a.Key())
				}
				for _, a := range ch.Removed {
					out[id] = append(out[id], "-"+a.Key())
				}
			}
		}
		return out
	}
	if got := toldChanges(); len(got) > 0 {
		t.Errorf("the first pass told %v of changes: nothing was claimed before", got)
	}
	onA := map[string][]string{"a": {"+a2/0"}}
	for _, tc := range []struct {
		name    string
		plan    *spec.Plan
		full    bool
		touched []string
		want    map[string][]string
		told    map[string][]string
	}{
		{"b's claims failed", change, false, nil, map[string][]string{"a": {"a1/0", "a2/0"}, "b": {"b1/0"}}, onA},
		{"a VM attached on a", change, false, nil, map[string][]string{"a": {"a1/0", "a2/0"}}, onA},
		{"c repaired", change, false, []string{"c"}, map[string][]string{"a": {"a1/0", "a2/0"}, "c": {"c1/0"}}, onA},
		{"a full pass", change, true, nil, all, nil},
		{"an up that changes nothing", &spec.Plan{}, false, nil, all, nil},
	} {
		got, err := pass(tc.plan, tc.full, tc.touched...)
		if err != nil || !cmp.Equal(got, tc.want, cmpopts.EquateEmpty()) {
			t.Errorf("%s: claimed %v, %v; want %v", tc.name, got, err, tc.want)
		}
		if told := toldChanges(); !cmp.Equal(told, tc.told, cmpopts.EquateEmpty()) {
			t.Errorf("%s: told %v of changes; want %v", tc.name, told, tc.told)
		}
	}
	// A change while a's network is down is not claimed: a's next claims
	// are made from every attachment, not told of the change after.
	delete(c.nets, "a")
	pass(change, false)
	c.nets["a"] = runningNetwork{}
	pass(change, false)
	if told := toldChanges(); len(told) > 0 {
		t.Errorf("after a change a's network missed: told %v of changes", told)
	}
	pass(change, false)
	if told := toldChanges(); !cmp.Equal(told, onA) {
		t.Errorf("claimed from everything again, then: told %v of changes; want %v", told, onA)
	}
}
