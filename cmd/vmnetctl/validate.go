package main

import (
	"github.com/spf13/cobra"
	"github.com/vmnetctl/vmnetctl/ops"
)

func newValidateCommand(g *globals, s streams) *cobra.Command {
	f := &vmFileFlags{}
	out := &output{}
	var backend string
	cmd := command("validate [-f FILE]... [--networks FILE] [--json]", "Check networks.yaml and VM files, reporting every problem with its file and line",
		cobra.NoArgs, func(*cobra.Command, []string) error {
			in, err := f.input(g)
			if err != nil {
				return err
			}
			if out.json {
				r, err := ops.ValidateReport(g.env(s), in, backend)
				if err != nil {
					return err
				}
				if err := out.print(s.out, r, nil); err != nil {
					return err
				}
				if !r.Valid {
					return exitError{code: 1}
				}
				return nil
			}
			v, err := ops.Validate(g.env(s), in, backend)
			if err != nil {
				return err
			}
			return v.Render(s.out)
		})
	f.bind(cmd, false)
	bindBackend(cmd, &backend)
	out.bind(cmd, "print JSON: {valid, problems: [{file, line, field, message, severity}], networks, attachments}; exit status 1 unless valid")
	return cmd
}
