package main

import (
	"fmt"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/vmnetctl/vmnetctl/controller"
)

// version is set at build time with -ldflags "-X main.version=vX.Y.Z".
var version = "v0.1.0-dev"

func newVersionCommand(s streams) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			// The same two lines vmnet-helper --version prints, then the platform.
			fmt.Fprintf(s.out, "version: %s\ncommit: %s\nplatform: %s/%s\n", version, controller.BuildCommit(), runtime.GOOS, runtime.GOARCH)
			return nil
		},
	}
}
