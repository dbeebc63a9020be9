package main

import (
	"github.com/spf13/cobra"
	"github.com/vmnetctl/vmnetctl/ops"
)

func newDoctorCommand(g *globals, s streams) *cobra.Command {
	out := &output{}
	cmd := command("doctor [--json]", "Check what vmnetctl needs on this host and what commonly breaks VM networks, saying what to do (exit status 1 on a problem)",
		cobra.NoArgs, func(cmd *cobra.Command, _ []string) error {
			in, err := ops.ReadInput(g.networks, nil, "", "")
			if err != nil {
				return err
			}
			r, err := ops.Doctor(cmd.Context(), g.env(s), in)
			if err != nil {
				return err
			}
			if err := out.print(s.out, r, r.Render); err != nil {
				return err
			}
			if r.Problems > 0 {
				return exitError{code: 1}
			}
			return nil
		})
	out.bind(cmd, "print JSON: {findings: [{check, status, detail, fix}], problems}")
	return cmd
}
