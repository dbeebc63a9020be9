package main

import (
	"github.com/spf13/cobra"

	"github.com/vmnetctl/vmnetctl/config"
)

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
				return printJSON(s.out, config.View(nets))
			}
			return config.Render(s.out, nets)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (a stable format, see docs/configuration.md)")
	return cmd
}
