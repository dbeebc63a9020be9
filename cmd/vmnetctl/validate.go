package main

import (
	"github.com/spf13/cobra"

	"github.com/vmnetctl/vmnetctl/controller"
)

func newValidateCommand(g *globals, s streams) *cobra.Command {
	f := &vmFileFlags{}
	var backend string
	cmd := command("validate [-f FILE]... [--networks FILE]", "Check networks.yaml and VM files, reporting every problem with its file and line",
		cobra.NoArgs, func(*cobra.Command, []string) error {
			in, err := f.input(g)
			if err != nil {
				return err
			}
			v, err := controller.Validate(g.env(s), in, backend)
			if err != nil {
				return err
			}
			return v.Render(s.out)
		})
	f.bind(cmd, false)
	bindBackend(cmd, &backend)
	return cmd
}
