package main

import (
	"context"
	"log/slog"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmnetctl/vmnetctl/controller"
	"github.com/vmnetctl/vmnetctl/ctlapi"
)

func newServeCommand(g *globals, s streams) *cobra.Command {
	var group, metricsAddr string
	var resync time.Duration
	var exitWhenIdle bool
	cmd := command("serve", "Run the controller in the foreground (what `up` starts in the background)",
		cobra.NoArgs, func(*cobra.Command, []string) error {
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			c, err := controller.New(controller.Options{
				StateDir:     g.dir(),
				Log:          slog.New(slog.NewTextHandler(s.err, nil)),
				Group:        group,
				MetricsAddr:  metricsAddr,
				Resync:       resync,
				ExitWhenIdle: exitWhenIdle,
				// The lock goes with the process.
				LockUntilExit: true,
				// A daemon: what its starter left open is not its.
				CloseInherited: true,
				Version:        version,
			})
			if err != nil {
				return err
			}
			return c.Run(ctx)
		})
	cmd.Flags().StringVar(&group, "group", "", "group allowed to use the controller's API socket (default: root only)")
	cmd.Flags().StringVar(&metricsAddr, "metrics-addr", ctlapi.DefaultMetricsAddr, `serve Prometheus /metrics and /healthz here ("off" for none)`)
	cmd.Flags().DurationVar(&resync, "resync", ctlapi.DefaultResync(),
		"how often the controller re-checks everything without being asked: helpers, and the networks' kernel state, which it repairs (default $"+ctlapi.EnvResync+", else 30s)")
	cmd.Flags().BoolVar(&exitWhenIdle, ctlapi.ExitWhenIdleFlag, false, "exit once no project is left (what the controller that up starts does); without it the controller stays, as a service")
	return cmd
}
