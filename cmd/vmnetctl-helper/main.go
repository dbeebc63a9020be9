//go:build linux

// Command vmnetctl-helper is `vmnetctl helper` as a binary of its own,
// which the controller runs for each attachment (helper.Program): the
// same flags (helper.Flags.Bind) and the same helper (helper.Main), which
// makes the VM's port and socket and then execs vmnetctl-relay, without
// the start of everything else vmnetctl links (Prometheus, cobra, the
// controller). The controller gives it `vmnetctl helper`'s command line,
// by which it knows the process: "helper" first, then the helper's flags
// and the global flags a helper takes (--networks, --state-dir). It brings
// up no network: the controller holds its own.
package main

import (
	"context"
	"fmt"
	"os"
	"runtime/debug"

	"github.com/vmnetctl/vmnetctl/helper"
)

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	f, err := helper.ParseCommandLine(args)
	if err != nil {
		fmt.Fprintln(os.Stderr, "vmnetctl:", err)
		return 2
	}
	f.Version, f.Commit = buildVersion()
	if err := helper.Main(context.Background(), f, helper.Streams{In: os.Stdin, Out: os.Stdout, Err: os.Stderr}); err != nil {
		fmt.Fprintln(os.Stderr, "vmnetctl:", err)
		return 1
	}
	return 0
}

// buildVersion is the module's version and the commit it was built from,
// as the build recorded them.
func buildVersion() (version, commit string) {
	version, commit = "unknown", "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		version = bi.Main.Version
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				commit = s.Value
			}
		}
	}
	return version, commit
}
