package main

import (
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/vmnetctl/vmnetctl/ops"
)

func newLogsCommand(g *globals, s streams) *cobra.Command {
	var follow, asJSON bool
	var tail int
	var since string
	cmd := command("logs [VM] [-f] [--json] [--tail N] [--since DURATION|TIME]", "Print the log of a VM's helpers (each line prefixed with VM/INDEX), or without VM the controller's",
		cobra.MaximumNArgs(1), func(cmd *cobra.Command, args []string) error {
			vm := ""
			if len(args) == 1 {
				vm = args[0]
			}
			from, err := ops.ParseSince(since, time.Now())
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return ops.LogsTail(ctx, g.dir(), vm, ops.TailOptions{Follow: follow, JSON: asJSON, Tail: tail, Since: from}, s.out)
		})
	cmd.Flags().IntVar(&tail, "tail", 0, "print only the last N lines (then, with -f, the new ones)")
	cmd.Flags().StringVar(&since, "since", "", "print only the lines logged since then: a duration (10m, 2h) or a time (2026-12-05T08:00:00Z); a line without a time goes with the one before it")
	cmd.Example = "  sudo vmnetctl logs            # the controller\n  sudo vmnetctl logs web -f     # web's helpers, following\n  sudo vmnetctl logs web --json"
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new lines until interrupted")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object per line: {time, vm, index, source, line} (time: the line's own, when it has one)")
	cmd.ValidArgsFunction = completeVMs(g)
	return cmd
}

// completeVMs completes the first argument with the VMs that are up.
func completeVMs(g *globals) cobra.CompletionFunc {
	return completeFirst(func() []string { vms, _ := ops.Names(g.dir()); return vms })
}

// completeNetworks completes the first argument with the networks that are up.
func completeNetworks(g *globals) cobra.CompletionFunc {
	return completeFirst(func() []string { _, nets := ops.Names(g.dir()); return nets })
}

// completeFirst completes a command's first argument with names.
func completeFirst(names func() []string) cobra.CompletionFunc {
	return func(_ *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return names(), cobra.ShellCompDirectiveNoFileComp
	}
}
