package main

import (
	"github.com/spf13/cobra"

	"github.com/vmnetctl/vmnetctl/controller"
)

func newStatusCommand(g *globals, s streams) *cobra.Command {
	out := &output{}
	cmd := command("status [--json]", "Show networks and attachments as they run (works without a controller too)",
		cobra.NoArgs, func(cmd *cobra.Command, _ []string) error {
			st, err := controller.CurrentStatus(cmd.Context(), g.dir())
			if err != nil {
				return err
			}
			return out.print(s.out, st, st.Render)
		})
	out.bind(cmd, "print JSON: a stable contract (docs/controller.md)")
	return cmd
}
