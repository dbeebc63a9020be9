package main

import (
	"fmt"
	"io"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/vmnetctl/vmnetctl/ops"
)

func newStatusCommand(g *globals, s streams) *cobra.Command {
	out := &output{}
	var watch time.Duration
	cmd := command("status [--json]", "Show networks and attachments as they run (works without a controller too)",
		cobra.NoArgs, func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			for {
				st, err := ops.CurrentStatus(ctx, g.dir())
				if err != nil {
					return err
				}
				if watch > 0 && !out.json {
					fmt.Fprintf(s.out, "\x1b[H\x1b[2J%s (every %s; Ctrl-C stops)\n", time.Now().Format(time.TimeOnly), watch)
				}
				if err := out.print(s.out, st, func(w io.Writer) error { return ops.RenderStatus(w, st) }); err != nil || watch <= 0 {
					return err
				}
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(watch):
				}
			}
		})
	cmd.Flags().DurationVarP(&watch, "watch", "w", 0, "print the status again every DURATION (like 2s) until interrupted (with --json, one JSON document each time)")
	out.bind(cmd, "print JSON: a stable contract (docs/controller.md)")
	return cmd
}
