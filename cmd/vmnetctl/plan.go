package main

import (
	"github.com/spf13/cobra"

	"github.com/vmnetctl/vmnetctl/controller"
)

func newPlanCommand(g *globals, s streams) *cobra.Command {
	f := &vmFileFlags{}
	var asJSON bool
	var backend string
	cmd := &cobra.Command{
		Use:   "plan -f FILE... [-p PROJECT]",
		Short: "Show what `up` would change, as a diff",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			in, err := f.input(g)
			if err != nil {
				return err
			}
			plan, err := controller.PlanApply(g.env(s), in, backend)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(s.out, plan)
			}
			plan.Render(s.out)
			return nil
		},
	}
	f.bind(cmd, true)
	bindBackend(cmd, &backend)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the plan as JSON")
	return cmd
}
