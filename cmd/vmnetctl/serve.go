package main

import (
	"context"
	"log/slog"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/vmnetctl/vmnetctl/controller"
	"github.com/vmnetctl/vmnetctl/statedir"
)

func newServeCommand(g *globals, s streams) *cobra.Command {
	var group, metricsAddr string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the controller in the foreground (what `up` starts in the background)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			c, err := controller.New(controller.Options{
				StateDir:    statedir.Dir{Path: g.stateDir},
				Log:         slog.New(slog.NewTextHandler(s.err, nil)),
				Group:       group,
				MetricsAddr: metricsAddr,
				Version:     version,
			})
			if err != nil {
				return err
			}
			return c.Run(ctx)
		},
	}
	cmd.Flags().StringVar(&group, "group", "", "group allowed to use the controller's API socket (default: root only)")
	cmd.Flags().StringVar(&metricsAddr, "metrics-addr", controller.DefaultMetricsAddr, `serve Prometheus /metrics and /healthz here ("off" for none)`)
	return cmd
}
