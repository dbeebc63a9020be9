package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=vX.Y.Z".
var version = "v0.1.0-dev"

// commit returns the VCS revision the binary was built from, if known.
func commit() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return "unknown"
}

func newVersionCommand(s streams) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			// The same two lines vmnet-helper --version prints, then the platform.
			fmt.Fprintf(s.out, "version: %s\ncommit: %s\nplatform: %s/%s\n", version, commit(), runtime.GOOS, runtime.GOARCH)
			return nil
		},
	}
}
