package main

import (
	"github.com/spf13/cobra"

	"github.com/vmnetctl/vmnetctl/controller"
)

func newDownCommand(g *globals, s streams) *cobra.Command {
	f := &vmFileFlags{}
	var all bool
	cmd := &cobra.Command{
		Use:   "down (-f FILE... | -p PROJECT | --all)",
		Short: "Remove a project: stop its helpers, and networks nothing needs any more (idempotent)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o := controller.RemoveOptions{All: all}
			if !all {
				in, err := f.input(g)
				if err != nil {
					return err
				}
				o.Input = in
			}
			return controller.Remove(cmd.Context(), g.env(s), o)
		},
	}
	f.bind(cmd, true)
	cmd.Flags().BoolVar(&all, "all", false, "remove every project")
	return cmd
}
