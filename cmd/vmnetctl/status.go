package main

import (
	"encoding/json"

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
			ctx := cmd.Context()
			sd := statedir.Dir{Path: g.stateDir}
			cl := controller.NewClient(sd)
			var st *controller.Status
			var err error
			if cl.Running(ctx) {
				st, err = cl.Status(ctx)
			} else {
				st, err = controller.OfflineStatus(ctx, sd)
			}
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(s.out)
				enc.SetIndent("", "  ")
				return enc.Encode(st)
			}
			st.Render(s.out)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON: a stable contract (docs/status.md)")
	return cmd
}
