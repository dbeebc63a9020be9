package main

import (
	"github.com/spf13/cobra"
	"github.com/vmnetctl/vmnetctl/ops"
)

func newPlanCommand(g *globals, s streams) *cobra.Command {
	f, out := &vmFileFlags{}, &output{}
	var backend string
	var detailed bool
	cmd := command("plan -f FILE... [-p PROJECT]", "Show what `up` would change, as a diff",
		cobra.NoArgs, func(*cobra.Command, []string) error {
			in, err := f.input(g)
			if err != nil {
				return err
			}
			plan, err := ops.PlanApply(g.env(s), in, backend)
			if err != nil {
				return err
			}
			if err := out.print(s.out, plan, plan.Render); err != nil {
				return err
			}
			if detailed && !plan.Empty() {
				return exitError{code: 2}
			}
			return nil
		})
	f.bind(cmd, true)
	bindBackend(cmd, &backend)
	out.bind(cmd, "print the plan as JSON")
	cmd.Flags().BoolVar(&detailed, "detailed-exitcode", false, "exit 2 when there are changes, 0 when none, 1 on an error (as terraform plan)")
	return cmd
}
