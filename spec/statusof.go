package spec

import (
	"runtime"
	"slices"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// NetworkStatusOf is n's status as configured, with the VMs of d on it,
// before anything is known of what runs.
func NetworkStatusOf(n *api.Network, d *Desired) ctlapi.NetworkStatus {
	ns := ctlapi.NetworkStatus{Name: n.ID, Mode: string(n.Mode), Bridge: n.Bridge(), Interface: n.Interface, VMs: []string{}, State: "down"}
	if n.Subnet.IsValid() {
		ns.Subnet, ns.Gateway = n.Subnet.String(), n.Gateway.String()
	}
	ns.Egress, ns.Partitions = n.Egress.String(), n.Partitions.String()
	if n.HasIPv6() && runtime.GOOS == "linux" { // on macOS vmnet chooses the prefix
		ns.Subnet6, ns.Gateway6, ns.NAT66 = n.Subnet6.String(), n.Gateway6.String(), n.RoutesIPv6()
	}
	for _, a := range d.Attachments {
		if a.Network == n.ID && !slices.Contains(ns.VMs, a.VM) {
			ns.VMs = append(ns.VMs, a.VM)
		}
	}
	return ns
}

// AttachmentStatusOf is a's status before anything is known of its helper.
func AttachmentStatusOf(a *Attachment) ctlapi.AttachmentStatus {
	as := ctlapi.AttachmentStatus{VM: a.VM, Index: a.Index, Network: a.Network, Project: a.Project, MAC: a.MAC, Attach: string(a.Attach), State: ctlapi.StateStopped}
	if a.IP.IsValid() {
		as.IP = a.IP.String()
	}
	as.Bandwidth, as.Egress, as.Impair = a.Bandwidth, a.Egress.String(), a.Impair
	return as
}

// AppliedState is what the controller last applied, from runtime.json; an
// empty state when nothing was.
func AppliedState(sd statedir.Dir) (*Desired, error) {
	rs, _, err := sd.LoadRuntime()
	if err != nil {
		return nil, err
	}
	return AppliedDesired(rs)
}

// AppliedDesired is the desired state a runtime record says was applied;
// an empty one when nothing was.
func AppliedDesired(rs statedir.Runtime) (*Desired, error) {
	if rs.AppliedNetworks == nil {
		return &Desired{}, nil
	}
	nets, err := rs.AppliedNetworks.Load()
	if err != nil {
		return nil, err
	}
	return ComputeDesired(nets, rs.AppliedProjects, KeptMACs(rs.Helpers))
}
