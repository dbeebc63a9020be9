package main

import (
	"context"
	"io"

	"github.com/spf13/cobra"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/controller"
	"github.com/vmnetctl/vmnetctl/helper"
	"github.com/vmnetctl/vmnetctl/ops"
)

func newHelperCommand(g *globals, s streams) *cobra.Command {
	f := &helper.Flags{}
	cmd := &cobra.Command{
		Use:   "helper (--fd FD | --socket PATH | --attach tap) [--network NAME | --operation-mode MODE]",
		Short: "Connect one VM to a network: vmnet-helper's contract on Linux (see docs/helper.md)",
		Long: `helper creates the VM's TAP on a vmnetctl network's bridge and relays Ethernet
frames between it and the VM process over a unix datagram socket, one frame per
datagram, like vmnet-helper on macOS. When the interface is ready it prints one
JSON line on stdout; it logs to stderr and stops on SIGTERM or SIGINT, deleting
the TAP. Run it as root: it drops to --uid/--gid (default $SUDO_UID/$SUDO_GID)
before it touches the VM's socket.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f.NetworksFile, f.StateDir, f.Version, f.Commit = g.networks, g.stateDir, version, controller.BuildCommit()
			f.EnsureNetwork = func(ctx context.Context, n *api.Network) error {
				env := g.env(s)
				env.Stdout = io.Discard // stdout is the JSON line's
				return ops.HoldNetwork(ctx, env, g.networks, n)
			}
			f.MadeOnDemand = g.dir().NetworkMadeOnDemand
			return helper.Main(cmd.Context(), *f, helper.Streams{In: s.in, Out: s.out, Err: s.err})
		},
	}
	f.Bind(cmd.Flags())
	return cmd
}
