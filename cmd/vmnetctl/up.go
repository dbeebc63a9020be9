package main

import (
	"io"

	"github.com/spf13/cobra"
	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/ops"
)

func newUpCommand(g *globals, s streams) *cobra.Command {
	f, out := &vmFileFlags{}, &output{}
	var metricsAddr string
	var force bool
	cmd := command("up -f FILE... [-p PROJECT]", "Bring up the networks and helpers of VM files, and return once every attachment is ready",
		cobra.NoArgs, func(cmd *cobra.Command, _ []string) error {
			in, err := f.input(g)
			if err != nil {
				return err
			}
			res, err := ops.Apply(cmd.Context(), g.env(s), in, ops.ApplyOptions{MetricsAddr: metricsAddr, Progress: out.progress(s.err), Force: force})
			if err != nil {
				return err
			}
			if err := out.print(s.out, res.Status, func(w io.Writer) error { return ops.RenderProject(w, res.Status, res.Project) }); err != nil {
				return err
			}
			// Printed, and still a failure for scripts: exit status 1.
			if err := res.Err(); err != nil {
				return exitError{code: 1, err: err}
			}
			return nil
		})
	f.bind(cmd, true)
	out.bind(cmd, "print the status as JSON")
	cmd.Flags().StringVar(&metricsAddr, "metrics-addr", ctlapi.DefaultMetricsAddr, `where the controller it starts serves Prometheus /metrics ("off" for none)`)
	cmd.Flags().BoolVar(&force, "force", false, "change or remove networks that other projects' VMs use (a networks.yaml named with --networks)")
	return cmd
}
