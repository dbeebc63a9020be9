package config

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/vmnetctl/vmnetctl/api"
)

// NetworkView is one network as `networks --json` prints it: the network
// with its defaults applied, plus what vmnetctl derives from it.
type NetworkView struct {
	*api.Network
	Managed          bool   `json:"managed"`
	Bridge           string `json:"bridge,omitempty"`
	LeaseTimeSeconds int    `json:"leaseTimeSeconds,omitempty"`
}

// NetworksView is `vmnetctl networks --json`, a stable format.
type NetworksView struct {
	Source   string        `json:"source"`
	Paths    api.Paths     `json:"paths"`
	Group    string        `json:"group,omitempty"`
	Networks []NetworkView `json:"networks"`
}

// View is nets as `networks --json` prints them.
func View(nets *api.Networks) NetworksView {
	v := NetworksView{Source: nets.Source, Paths: nets.Paths, Group: nets.Group, Networks: []NetworkView{}}
	for _, n := range nets.Networks {
		nv := NetworkView{Network: n, Managed: n.Managed(), Bridge: n.Bridge()}
		if n.Routed() && n.DHCP {
			nv.LeaseTimeSeconds = int(n.LeaseTime.Seconds())
		}
		if nv.Reservations == nil {
			nv.Reservations = []api.Reservation{}
		}
		v.Networks = append(v.Networks, nv)
	}
	return v
}

// Render writes nets as a table, one network a line.
func Render(w io.Writer, nets *api.Networks) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tMODE\tSUBNET\tGATEWAY\tDHCP RANGE\tIPV6\tMTU\tBRIDGE\tDEFINED AT")
	for _, n := range nets.Networks {
		subnet, gw, dhcp, ip6, bridge := "-", "-", "-", "-", n.Bridge()
		if n.Subnet.IsValid() {
			subnet, gw = n.Subnet.String(), n.Gateway.String()
		}
		if n.HasIPv6() {
			ip6 = n.Subnet6.String()
			if n.RoutesIPv6() {
				ip6 += " (NAT66)"
			}
		}
		switch {
		case !n.Managed():
			bridge = "not managed by vmnetctl"
		case n.Mode == api.ModeBridged:
			bridge = "onto " + n.Interface
			dhcp = "from the LAN"
		case n.DHCP:
			dhcp = n.DHCPStart.String() + "-" + n.DHCPEnd.String()
		default:
			dhcp = "off"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", n.ID, n.Mode, subnet, gw, dhcp, ip6, n.MTU, bridge, n.Source)
	}
	return tw.Flush()
}
