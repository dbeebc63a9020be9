package ops

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/procid"
	"github.com/vmnetctl/vmnetctl/spec"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// networksOf parses the networks of in, or of record when in names none.
func networksOf(env Env, in *Input) (*api.Networks, error) {
	if err := in.useNetworksOfRecord(env); err != nil {
		return nil, err
	}
	nets, diags := api.LoadNetworks(in.Networks.Source, in.Networks.Data)
	env.warn(diags)
	if err := diags.Err(); err != nil {
		return nil, err
	}
	return nets, nil
}

// lookupNetwork returns network id of nets, or an error listing the others.
func lookupNetwork(nets *api.Networks, id string) (*api.Network, error) {
	n := nets.Get(id)
	if n == nil {
		var ids []string
		for _, x := range nets.Networks {
			ids = append(ids, x.ID)
		}
		return nil, fmt.Errorf("network %q is not defined in %s; its networks: %s", id, nets.Source, strings.Join(ids, ", "))
	}
	if !n.Managed() {
		return nil, fmt.Errorf("network %q is %s, which vmnetctl does not run", id, n.Mode)
	}
	return n, nil
}

// NetworkCreate is `vmnetctl network create`: it keeps network id up with
// no VM (as lima's `network create` and virsh's `net-start` do), recorded
// as project "network.ID", and returns once the controller has converged.
func NetworkCreate(ctx context.Context, env Env, in *Input, id string, o ApplyOptions) (*ctlapi.Status, error) {
	nets, err := networksOf(env, in)
	if err != nil {
		return nil, err
	}
	if _, err := lookupNetwork(nets, id); err != nil {
		return nil, err
	}
	p := &statedir.Project{Name: statedir.NetworkProjectPrefix + id, Networks: []string{id},
		UID: ownerID("SUDO_UID", os.Getuid()), GID: ownerID("SUDO_GID", os.Getgid())}
	resp, err := applyProject(ctx, env, in, nets, p, resolvesWith(nets, p), o)
	if err != nil {
		return nil, err
	}
	return resp.Status, nil
}

// HoldNetwork brings network n (of the networks.yaml at networksPath, or
// the defaults, or one made on demand: n.OnDemand) up for as long as this
// process runs: a `vmnetctl helper`
// started on a network that is not up, as vmnet-helper is started on
// macOS with nothing else running. It records project "hold.PID" held by
// this process; the controller drops it when the process is gone, and the
// network goes once nothing else needs it.
func HoldNetwork(ctx context.Context, env Env, networksPath string, n *api.Network) error {
	id := n.ID
	in, err := ReadInput(networksPath, nil, "", "")
	if err != nil {
		return err
	}
	self, err := procid.Self()
	if err != nil {
		return err
	}
	// A helper holds a network; it does not choose the networks of the
	// state dir's projects: with projects, the networks of record stay in
	// force, and the helper's network must be theirs.
	in.NetworksNamed = false
	nets, err := networksOf(env, in)
	if err != nil {
		return err
	}
	if n.OnDemand == nil {
		held, err := lookupNetwork(nets, id)
		if err != nil {
			return err
		}
		if h, w := spec.DescribeNetwork(held), spec.DescribeNetwork(n); h != w {
			return fmt.Errorf("network %q in force (%s) is %s, not the helper's %s (%s): run the helper with --networks %s",
				id, nets.Source, h, w, n.Source, nets.Source)
		}
	}
	p := &statedir.Project{Name: fmt.Sprintf("%s%d", statedir.HolderProjectPrefix, os.Getpid()), Networks: []string{id},
		UID: ownerID("SUDO_UID", os.Getuid()), GID: ownerID("SUDO_GID", os.Getgid()), Holder: &self, OnDemand: n.OnDemand}
	resp, err := applyProject(ctx, env, in, nets, p, resolvesWith(nets, p), ApplyOptions{MetricsAddr: ctlapi.DefaultMetricsAddr})
	if err != nil {
		return err
	}
	for _, n := range resp.Status.Networks {
		if n.Name == id && n.State != "up" {
			return fmt.Errorf("network %q did not come up: %s", id, n.Error)
		}
	}
	return nil
}

// resolvesWith is applyProject's check for a project of files-less kind
// (network.NAME, hold.PID): the state dir's projects, p replacing one of
// its name, resolve against nets.
func resolvesWith(nets *api.Networks, p *statedir.Project) func(sd statedir.Dir) error {
	return func(sd statedir.Dir) error {
		existing, err := sd.Projects()
		if err != nil {
			return err
		}
		others := slices.DeleteFunc(slices.Clone(existing), func(q *statedir.Project) bool { return q.Name == p.Name })
		parsed, diags := spec.ParseProjects(append(others, p))
		_, rdiags := spec.Resolve(nets, parsed, nil)
		return append(diags, rdiags...).Err()
	}
}

// NetworkDeleted is what `vmnetctl network delete` did.
type NetworkDeleted struct {
	Network string `json:"network"`
	// WasKept is whether the network was kept up on its own before.
	WasKept bool `json:"wasKept"`
	// State is the network's state after: "down", or "up" while VMs use it.
	State string `json:"state"`
}

// NetworkDelete is `vmnetctl network delete`: the network is no longer
// kept up on its own; it goes once no VM uses it.
func NetworkDelete(ctx context.Context, env Env, id string) (*NetworkDeleted, error) {
	res := &NetworkDeleted{Network: id, State: "down"}
	projects, err := env.StateDir.Projects()
	if err != nil {
		return nil, err
	}
	for _, p := range projects {
		res.WasKept = res.WasKept || p.Name == statedir.NetworkProjectPrefix+id
	}
	if !res.WasKept {
		// A network that exists (of record, or of networks.yaml) and is
		// not kept: deleting it twice is fine. One that does not exist
		// is an error.
		in, err := ReadInput("", nil, "", "")
		if err != nil {
			return nil, err
		}
		nets, err := networksOf(env, in)
		if err != nil {
			return nil, err
		}
		if _, err := lookupNetwork(nets, id); err != nil {
			return nil, err
		}
		if env.Stdout != nil {
			fmt.Fprintf(env.Stdout, "network %s is not kept (network create makes one)\n", id)
		}
	} else if err := Remove(ctx, env, RemoveOptions{Input: &Input{Project: statedir.NetworkProjectPrefix + id}}); err != nil {
		return nil, err
	}
	if st, err := CurrentStatus(ctx, env.StateDir); err == nil {
		for _, n := range st.Networks {
			if n.Name == id {
				res.State = n.State
			}
		}
	}
	return res, nil
}

// NetworkInfo is one network in `vmnetctl network list` and `inspect`.
type NetworkInfo struct {
	Name   string `json:"name"`
	Mode   string `json:"mode"`
	Subnet string `json:"subnet,omitempty"`
	Bridge string `json:"bridge,omitempty"`
	// State is the status's ("up", "degraded", "error"), or "down".
	State  string   `json:"state"`
	Error  string   `json:"error,omitempty"`
	VMs    []string `json:"vms"`
	Leases int      `json:"leases"`
	// Kept is set for a network kept up with no VM (network create).
	Kept bool `json:"kept"`
	// Config is the network as networks.yaml defines it, defaults applied
	// (inspect only).
	Config *api.Network `json:"config,omitempty"`
	// LeaseList is its leases (inspect only).
	LeaseList []LeaseStatus `json:"leaseList,omitempty"`
}

// NetworkList is `vmnetctl network list`.
type NetworkList struct {
	Source   string        `json:"source"`
	Networks []NetworkInfo `json:"networks"`
}

// Networks lists every network of the networks of record (or of in), with
// its state.
func Networks(ctx context.Context, env Env, in *Input) (*NetworkList, error) {
	nets, err := networksOf(env, in)
	if err != nil {
		return nil, err
	}
	st, err := CurrentStatus(ctx, env.StateDir)
	if err != nil {
		return nil, err
	}
	projects, _ := env.StateDir.Projects()
	l := &NetworkList{Source: nets.Source, Networks: []NetworkInfo{}}
	for _, n := range nets.Networks {
		info := NetworkInfo{Name: n.ID, Mode: string(n.Mode), State: "down", VMs: []string{}}
		if n.Subnet.IsValid() {
			info.Subnet = n.Subnet.String()
		}
		if n.Routed() {
			info.Bridge = n.Bridge()
		}
		for _, ns := range st.Networks {
			if ns.Name == n.ID {
				info.State, info.Error, info.VMs, info.Leases = ns.State, ns.Error, ns.VMs, ns.Leases
			}
		}
		for _, p := range projects {
			info.Kept = info.Kept || slices.Contains(p.Networks, n.ID)
		}
		l.Networks = append(l.Networks, info)
	}
	return l, nil
}

// NetworkInspect is everything about network id: its configuration, state
// and leases.
func NetworkInspect(ctx context.Context, env Env, in *Input, id string) (*NetworkInfo, error) {
	l, err := Networks(ctx, env, in)
	if err != nil {
		return nil, err
	}
	nets, _ := networksOf(env, in)
	n := nets.Get(id)
	if n == nil {
		_, err := lookupNetwork(nets, id)
		return nil, err
	}
	for _, info := range l.Networks {
		if info.Name == id {
			info.Config = n
			if ls, err := Leases(env.StateDir, id); err == nil {
				info.LeaseList = ls.Leases
			}
			return &info, nil
		}
	}
	return nil, fmt.Errorf("network %q not found", id)
}

// Render writes the list as a table.
func (l *NetworkList) Render(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NETWORK\tMODE\tSUBNET\tBRIDGE\tSTATE\tVMS\tLEASES\tKEPT")
	for _, n := range l.Networks {
		kept := ""
		if n.Kept {
			kept = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", n.Name, n.Mode, dash(n.Subnet), dash(n.Bridge), n.State, dash(strings.Join(n.VMs, ",")), n.Leases, dash(kept))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "(from %s)\n", l.Source)
	return err
}

// Render writes one network's information.
func (n *NetworkInfo) Render(w io.Writer) error {
	row := func(k, v string) { fmt.Fprintf(w, "%-10s %s\n", k+":", v) }
	row("network", n.Name)
	row("mode", n.Mode)
	row("subnet", dash(n.Subnet))
	if n.Config != nil && n.Config.Gateway.IsValid() {
		row("gateway", n.Config.Gateway.String())
	}
	if n.Config != nil && n.Config.HasIPv6() && runtime.GOOS == "linux" { // on macOS vmnet chooses the prefix
		row("subnet6", n.Config.Subnet6.String())
		row("gateway6", n.Config.Gateway6.String())
		row("nat66", fmt.Sprint(n.Config.RoutesIPv6()))
	}
	row("bridge", dash(n.Bridge))
	state := n.State
	if n.Error != "" {
		state += ": " + n.Error
	}
	row("state", state)
	row("kept", fmt.Sprint(n.Kept))
	if n.Config != nil && n.Config.Egress != nil {
		row("egress", n.Config.Egress.String()) // a VM file's own policy overrides it (describe)
	}
	row("VMs", dash(strings.Join(n.VMs, ", ")))
	if len(n.LeaseList) == 0 {
		row("leases", "none")
		return nil
	}
	fmt.Fprintln(w, "leases:")
	return (&LeaseList{Leases: n.LeaseList}).Render(w)
}
