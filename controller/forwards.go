package controller

import (
	"context"

	"github.com/vmnetctl/vmnetctl/backend"
	"github.com/vmnetctl/vmnetctl/spec"
)

// forwardsOf returns the port forwards of desired, by network.
func forwardsOf(desired *spec.Desired) map[string][]backend.Forward {
	out := map[string][]backend.Forward{}
	for _, a := range desired.Attachments {
		for _, pf := range a.PortForwards {
			out[a.Network] = append(out[a.Network], backend.Forward{PortForward: pf, Key: a.Key(), MAC: a.MAC})
		}
	}
	return out
}

// setForwards gives each running network its attachments' port forwards.
func (c *Controller) setForwards(ctx context.Context, desired *spec.Desired) []error {
	byNet := forwardsOf(desired)
	var errs []error
	for _, n := range desired.Networks {
		if nw := c.nets[n.ID]; nw != nil {
			if err := nw.SetForwards(ctx, byNet[n.ID]); err != nil {
				errs = append(errs, err)
			}
			var ps []backend.VMEgress
			for _, a := range desired.Attachments {
				if a.Network == n.ID && a.Egress != nil {
					ps = append(ps, backend.VMEgress{MAC: a.MAC, Egress: a.Egress})
				}
			}
			if err := nw.SetVMEgress(ctx, ps); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errs
}
