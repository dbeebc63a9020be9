package controller

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"github.com/vmnetctl/vmnetctl/backend"
)

// forwardsOf returns the port forwards of desired, by network.
func forwardsOf(desired *Desired) map[string][]backend.Forward {
	out := map[string][]backend.Forward{}
	for _, a := range desired.Attachments {
		for _, pf := range a.PortForwards {
			out[a.Network] = append(out[a.Network], backend.Forward{PortForward: pf, Key: a.Key(), MAC: a.MAC})
		}
	}
	return out
}

// setForwards gives each running network its attachments' port forwards.
func (c *Controller) setForwards(ctx context.Context, desired *Desired) []error {
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

// checkForwardPorts refuses the port forwards of project whose host port
// a program of the host listens on: the forward would take its
// connections (DNAT comes first), which nobody asked for. A port that
// only vmnetctl forwards is free: DNAT binds nothing.
func checkForwardPorts(desired *Desired, project string) error {
	var errs []error
	for _, a := range desired.Attachments {
		if a.Project != project {
			continue
		}
		for _, pf := range a.PortForwards {
			for port := pf.HostPort.First; port <= pf.HostPort.Last; port++ {
				if err := portFree(pf.Proto, pf.HostIP, port); err != nil {
					errs = append(errs, fmt.Errorf("%s: VM %s forwards host port %d/%s, which is in use on the host (%v): stop what listens there, or forward another port",
						pf.Source, a.VM, port, pf.Proto, err))
					break
				}
			}
		}
	}
	return errors.Join(errs...)
}

// portFree reports whether nothing listens on ip:port (every address when
// ip is 0.0.0.0): it binds the port for a moment.
func portFree(proto string, ip netip.Addr, port int) error {
	addr := net.JoinHostPort(ip.String(), fmt.Sprint(port))
	var err error
	if proto == "udp" {
		var c net.PacketConn
		if c, err = net.ListenPacket("udp4", addr); err == nil {
			return c.Close()
		}
	} else {
		var l net.Listener
		if l, err = net.Listen("tcp4", addr); err == nil {
			return l.Close()
		}
	}
	if errors.Is(err, syscall.EADDRINUSE) {
		return errors.New("address in use")
	}
	return nil // not ours to judge (an address the host does not have yet, say)
}
