package main

import (
	"github.com/spf13/cobra"

	"github.com/vmnetctl/vmnetctl/controller"
)

func newUpCommand(g *globals, s streams) *cobra.Command {
	f := &vmFileFlags{}
	var asJSON bool
	var metricsAddr string
	cmd := &cobra.Command{
		Use:   "up -f FILE... [-p PROJECT]",
		Short: "Bring up the networks and helpers of VM files, and return once every attachment is ready",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			in, err := f.input(g)
			if err != nil {
				return err
			}
			res, err := controller.Apply(cmd.Context(), g.env(s), in, controller.ApplyOptions{MetricsAddr: metricsAddr})
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(s.out, res.Status)
			}
			return res.Status.RenderProject(s.out, res.Project)
		},
	}
	f.bind(cmd, true)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the status as JSON")
	cmd.Flags().StringVar(&metricsAddr, "metrics-addr", controller.DefaultMetricsAddr, `where the controller it starts serves Prometheus /metrics ("off" for none)`)
	return cmd
}
