package main

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/config"
)

// networkView is one network as `networks --json` prints it: the network
// with its defaults applied, plus what vmnetctl derives from it.
type networkView struct {
	*api.Network
	Managed          bool   `json:"managed"`
	Bridge           string `json:"bridge,omitempty"`
	LeaseTimeSeconds int    `json:"leaseTimeSeconds,omitempty"`
}

type networksView struct {
	Source   string        `json:"source"`
	Paths    api.Paths     `json:"paths"`
	Group    string        `json:"group,omitempty"`
	Networks []networkView `json:"networks"`
}

func viewNetworks(nets *api.Networks) networksView {
	v := networksView{Source: nets.Source, Paths: nets.Paths, Group: nets.Group, Networks: []networkView{}}
	for _, n := range nets.Networks {
		nv := networkView{Network: n, Managed: n.Managed(), Bridge: n.Bridge()}
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

func newNetworksCommand(g *globals, s streams) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "networks",
		Short: "List the networks defined in networks.yaml, with defaults applied",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			nets, diags, err := config.LoadNetworks(g.networks)
			printWarnings(s.err, diags)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(s.out)
				enc.SetIndent("", "  ")
				return enc.Encode(viewNetworks(nets))
			}
			tw := tabwriter.NewWriter(s.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tMODE\tSUBNET\tGATEWAY\tDHCP RANGE\tMTU\tBRIDGE\tDEFINED AT")
			for _, n := range nets.Networks {
				subnet, gw, dhcp, bridge := "-", "-", "-", n.Bridge()
				if n.Subnet.IsValid() {
					subnet, gw = n.Subnet.String(), n.Gateway.String()
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
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", n.ID, n.Mode, subnet, gw, dhcp, n.MTU, bridge, n.Source)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (a stable format, see docs/configuration.md)")
	return cmd
}
