package main

import (
	"github.com/spf13/cobra"

	"github.com/vmnetctl/vmnetctl/controller"
	"github.com/vmnetctl/vmnetctl/statedir"
)

func newStatusCommand(g *globals, s streams) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status [--json]",
		Short: "Show networks and attachments as they run (works without a controller too)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := controller.CurrentStatus(cmd.Context(), statedir.Dir{Path: g.stateDir})
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(s.out, st)
			}
			st.Render(s.out)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON: a stable contract (docs/controller.md)")
	return cmd
}
