package main

import (
	"encoding/json"

	"github.com/spf13/cobra"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/controller"
	"github.com/vmnetctl/vmnetctl/statedir"
)

func newPlanCommand(g *globals, s streams) *cobra.Command {
	f := &projectFlags{}
	be := &backendFlag{}
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "plan -f FILE... [-p PROJECT]",
		Short: "Show what `up` would change, as a diff",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			p, _, nets, err := loadProject(g, f, s)
			if err != nil {
				return err
			}
			sd := statedir.Dir{Path: g.stateDir}
			current, err := controller.AppliedState(sd)
			if err != nil {
				return err
			}
			existing, err := sd.Projects()
			if err != nil {
				return err
			}
			desired, err := controller.ComputeDesired(nets, withProject(existing, p))
			if err != nil {
				return err
			}
			var atts []*api.Attachment
			for _, a := range desired.Attachments {
				atts = append(atts, a.Attachment)
			}
			if err := warnBackend(s.err, be, desired.Networks, atts); err != nil {
				return err
			}
			plan := controller.ComputePlan(current, desired)
			if asJSON {
				enc := json.NewEncoder(s.out)
				enc.SetIndent("", "  ")
				return enc.Encode(plan)
			}
			plan.Render(s.out)
			return nil
		},
	}
	f.bind(cmd)
	be.bind(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the plan as JSON")
	return cmd
}
