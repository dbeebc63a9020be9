package main

import (
	"github.com/spf13/cobra"
	"github.com/vmnetctl/vmnetctl/ops"
)

func newDescribeCommand(g *globals, s streams) *cobra.Command {
	out := &output{}
	cmd := command("describe VM [--json]", "Everything about a VM's attachments: helper, peer, port, lease, drops, the end of its log, and what to do",
		cobra.ExactArgs(1), func(cmd *cobra.Command, args []string) error {
			d, err := ops.Describe(cmd.Context(), g.dir(), args[0])
			if err != nil {
				return err
			}
			return out.print(s.out, d, d.Render)
		})
	cmd.Example = "  sudo vmnetctl describe web\n  sudo vmnetctl describe web --json"
	cmd.ValidArgsFunction = completeVMs(g)
	out.bind(cmd, "print JSON")
	return cmd
}
