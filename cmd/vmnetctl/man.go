package main

import (
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

// newManCommand writes a man page per command (for the packages; hidden).
func newManCommand(root *cobra.Command) *cobra.Command {
	cmd := command("man DIR", "Write the man pages of every command into DIR", cobra.ExactArgs(1),
		func(_ *cobra.Command, args []string) error {
			if err := os.MkdirAll(args[0], 0o755); err != nil {
				return err
			}
			return doc.GenManTree(root, &doc.GenManHeader{Title: "VMNETCTL", Section: "8", Source: "vmnetctl " + version}, args[0])
		})
	cmd.Hidden = true
	return cmd
}
