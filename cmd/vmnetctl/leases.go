package main

import (
	"github.com/spf13/cobra"
	"github.com/vmnetctl/vmnetctl/ops"
)

func newLeasesCommand(g *globals, s streams) *cobra.Command {
	out := &output{}
	cmd := command("leases [NETWORK] [--json]", "List the DHCP leases of the networks that are up (MAC, IP, hostname, VM, expiry); works without a controller",
		cobra.MaximumNArgs(1), func(_ *cobra.Command, args []string) error {
			network := ""
			if len(args) == 1 {
				network = args[0]
			}
			l, err := ops.Leases(g.dir(), network)
			if err != nil {
				return err
			}
			return out.print(s.out, l, l.Render)
		})
	cmd.Example = "  sudo vmnetctl leases\n  sudo vmnetctl leases shared --json"
	cmd.ValidArgsFunction = completeNetworks(g)
	out.bind(cmd, "print JSON: {leases: [{network, ip, mac, hostname, vm, expiry}]}")
	return cmd
}
