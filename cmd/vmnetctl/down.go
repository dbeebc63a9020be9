package main

import (
	"github.com/spf13/cobra"
	"github.com/vmnetctl/vmnetctl/ops"
)

func newDownCommand(g *globals, s streams) *cobra.Command {
	f := &vmFileFlags{}
	var all bool
	cmd := command("down (-f FILE... | -p PROJECT | --all)", "Remove a project: stop its helpers, and networks nothing needs any more (idempotent)",
		cobra.NoArgs, func(cmd *cobra.Command, _ []string) error {
			o := ops.RemoveOptions{All: all}
			if !all {
				in, err := f.input(g)
				if err != nil {
					return err
				}
				o.Input = in
			}
			return ops.Remove(cmd.Context(), g.env(s), o)
		})
	f.bind(cmd, true)
	cmd.Flags().BoolVar(&all, "all", false, "remove every project")
	return cmd
}
