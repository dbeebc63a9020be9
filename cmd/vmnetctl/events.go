package main

import (
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/ops"
)

func newEventsCommand(g *globals, s streams) *cobra.Command {
	var follow, asJSON bool
	var tail int
	var since, kinds string
	var f ops.EventFilter
	cmd := command("events [-f] [--json] [--tail N] [--since DURATION|TIME] [--kind K,...] [--vm VM] [--network N]", "Print what happened: networks up and removed, drift found and repaired, helpers started, exited and failed, leases granted, released, declined and expired, connections refused by egress policies",
		cobra.NoArgs, func(cmd *cobra.Command, _ []string) error {
			from, err := ops.ParseSince(since, time.Now())
			if err != nil {
				return err
			}
			if f.Kinds, err = ops.ParseKinds(kinds); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return ops.EventsTail(ctx, g.dir(), ops.TailOptions{JSON: asJSON, Follow: follow, Tail: tail, Since: from}, f, s.out)
		})
	cmd.Flags().StringVar(&kinds, "kind", "", "print only events of these kinds, separated by commas: "+strings.Join(ctlapi.EventKinds, ", "))
	cmd.Flags().StringVar(&f.VM, "vm", "", "print only the events of this VM's attachments")
	cmd.Flags().StringVar(&f.Network, "network", "", "print only the events on this network")
	cmd.Flags().IntVar(&tail, "tail", 0, "print only the last N events (then, with -f, the new ones)")
	cmd.Flags().StringVar(&since, "since", "", "print only the events since then: a duration (10m, 2h) or a time (2026-12-05T08:00:00Z)")
	cmd.Example = "  sudo vmnetctl events -f\n  sudo vmnetctl events --kind egress-denied --vm web --since 1h\n  sudo vmnetctl events --json | jq 'select(.kind == \"lease-granted\")'"
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new events until interrupted")
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object per line: {time, kind, network, attachment, mac, ip, pid, detail}")
	return cmd
}
