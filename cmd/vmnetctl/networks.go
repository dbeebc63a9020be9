package main

import (
	"io"

	"github.com/spf13/cobra"

	"github.com/vmnetctl/vmnetctl/config"
)

func newNetworksCommand(g *globals, s streams) *cobra.Command {
	out := &output{}
	cmd := command("networks", "List the networks defined in networks.yaml, with defaults applied",
		cobra.NoArgs, func(*cobra.Command, []string) error {
			nets, diags, err := config.LoadNetworks(g.networks)
			printWarnings(s.err, diags)
			if err != nil {
				return err
			}
			return out.print(s.out, config.View(nets), func(w io.Writer) error { return config.Render(w, nets) })
		})
	out.bind(cmd, "print JSON (a stable format, see docs/configuration.md)")
	return cmd
}
