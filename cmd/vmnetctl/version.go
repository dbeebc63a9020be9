package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/vmnetctl/vmnetctl/controller"
)

// release is the version being worked towards, the one place it is
// written: the Makefile reads it for the packages' version.
const release = "0.1.0"

// version is set at build time with -ldflags "-X main.version=vX.Y.Z"
// (make, a release); without it, the same string is derived from the
// build (versionOf), so that make and go build agree.
var version string

func init() { version = versionOf(version, buildInfo()) }

// buildInfo is the binary's build information, nil without it.
func buildInfo() *debug.BuildInfo {
	bi, _ := debug.ReadBuildInfo()
	return bi
}

// versionOf is set if the build set a version, else what the Makefile
// gives a tree at its commit: v<release>+git<7 hex digits>, or
// v<release>-dev for a build without version control information.
func versionOf(set string, bi *debug.BuildInfo) string {
	if set != "" {
		return set
	}
	if bi != nil {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 7 {
				return "v" + release + "+git" + s.Value[:7]
			}
		}
	}
	return "v" + release + "-dev"
}

// versionInfo is `vmnetctl version --json`.
type versionInfo struct {
	Version  string `json:"version"`
	Commit   string `json:"commit"`
	Platform string `json:"platform"`
}

func newVersionCommand(s streams) *cobra.Command {
	out := &output{}
	cmd := &cobra.Command{
		Use:   "version [--json]",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			v := versionInfo{Version: version, Commit: controller.BuildCommit(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
			return out.print(s.out, v, func(w io.Writer) error {
				// The same two lines vmnet-helper --version prints, then the platform.
				_, err := fmt.Fprintf(w, "version: %s\ncommit: %s\nplatform: %s\n", v.Version, v.Commit, v.Platform)
				return err
			})
		},
	}
	out.bind(cmd, "print JSON: {version, commit, platform}")
	return cmd
}
