package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/ops"
)

// newNetworkCommand is `vmnetctl network list|create|delete|inspect`:
// networks as objects of their own, with or without VMs.
func newNetworkCommand(g *globals, s streams) *cobra.Command {
	cmd := &cobra.Command{Use: "network", Short: "Networks as objects of their own: list, create (keep up without a VM), delete, inspect"}
	input := func() (*ops.Input, error) { return ops.ReadInput(g.networks, nil, "", "") }

	out := &output{}
	list := command("list [--json]", "Every network of networks.yaml (of record) with its state, VMs, leases, and whether it is kept up on its own",
		cobra.NoArgs, func(cmd *cobra.Command, _ []string) error {
			in, err := input()
			if err != nil {
				return err
			}
			l, err := ops.Networks(cmd.Context(), g.env(s), in)
			if err != nil {
				return err
			}
			return out.print(s.out, l, l.Render)
		})
	out.bind(list, "print JSON")

	createOut := &output{}
	var metricsAddr string
	create := command("create NAME [--json]", "Bring network NAME up and keep it up with no VM, until `network delete`",
		cobra.ExactArgs(1), func(cmd *cobra.Command, args []string) error {
			in, err := input()
			if err != nil {
				return err
			}
			st, err := ops.NetworkCreate(cmd.Context(), g.env(s), in, args[0], ops.ApplyOptions{MetricsAddr: metricsAddr})
			if err != nil {
				return err
			}
			for _, n := range st.Networks {
				if n.Name == args[0] && n.State != "up" {
					createOut.print(s.out, st, func(w io.Writer) error { return ops.RenderStatus(w, st) })
					return exitError{code: 1, err: fmt.Errorf("network %s is %s: %s", n.Name, n.State, n.Error)}
				}
			}
			return createOut.print(s.out, st, func(w io.Writer) error { return ops.RenderStatus(w, st) })
		})
	createOut.bind(create, "print the status as JSON")
	create.Flags().StringVar(&metricsAddr, "metrics-addr", ctlapi.DefaultMetricsAddr, `where the controller it starts serves Prometheus /metrics ("off" for none)`)

	delOut := &output{}
	del := command("delete NAME [--json]", "Stop keeping network NAME up on its own: it goes once no VM uses it",
		cobra.ExactArgs(1), func(cmd *cobra.Command, args []string) error {
			env := g.env(s)
			if delOut.json {
				env.Stdout = io.Discard // stdout is the JSON's
			}
			res, err := ops.NetworkDelete(cmd.Context(), env, args[0])
			if err != nil || !delOut.json {
				return err
			}
			return delOut.print(s.out, res, nil)
		})
	delOut.bind(del, "print JSON: {network, wasKept, state}")

	inspectOut := &output{}
	inspect := command("inspect NAME [--json]", "Everything about network NAME: its configuration, state, VMs and leases",
		cobra.ExactArgs(1), func(cmd *cobra.Command, args []string) error {
			in, err := input()
			if err != nil {
				return err
			}
			n, err := ops.NetworkInspect(cmd.Context(), g.env(s), in, args[0])
			if err != nil {
				return err
			}
			return inspectOut.print(s.out, n, n.Render)
		})
	inspectOut.bind(inspect, "print JSON")

	for _, c := range []*cobra.Command{del, inspect} {
		c.ValidArgsFunction = completeNetworks(g)
	}
	// create: any network of record (or of networks.yaml), up or not.
	create.ValidArgsFunction = completeFirst(func() []string { return ops.DefinedNetworks(g.dir(), g.networks) })
	create.Example = "  sudo vmnetctl network create host         # host stays up with no VM\n  sudo vmnetctl network create host --json  # the status, as JSON"
	list.Example = "  sudo vmnetctl network list\n  sudo vmnetctl network list --json"
	del.Example = "  sudo vmnetctl network delete host\n  sudo vmnetctl network delete host --json"
	inspect.Example = "  sudo vmnetctl network inspect shared\n  sudo vmnetctl network inspect shared --json | jq '.leaseList // []'"
	cmd.Example = "  sudo vmnetctl network create host\n  sudo vmnetctl network list"
	cmd.AddCommand(list, create, del, inspect)
	return cmd
}
