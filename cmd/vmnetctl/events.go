package main

import (
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/vmnetctl/vmnetctl/controller"
)

func newEventsCommand(g *globals, s streams) *cobra.Command {
	var follow, asJSON bool
	cmd := command("events [-f] [--json]", "Print what happened: networks up and removed, drift found and repaired, helpers started, exited and failed, leases granted, released, declined and expired",
		cobra.NoArgs, func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return controller.Events(ctx, g.dir(), asJSON, follow, s.out)
		})
	cmd.Example = "  sudo vmnetctl events -f\n  sudo vmnetctl events --json | jq 'select(.kind == \"lease-granted\")'"
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new events until interrupted")
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object per line: {time, kind, network, attachment, mac, ip, pid, detail}")
	return cmd
}
