package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// streams are the command's standard I/O, passed in so tests can run commands.
type streams struct {
	in       io.Reader
	out, err io.Writer
}

// globals are the flags every command shares.
type globals struct {
	networks string
	stateDir string
}

// run executes the command line args and returns the exit status.
func run(args []string, s streams) int {
	cmd := newRootCommand(s)
	cmd.SetArgs(args)
	if err := cmd.Execute(); err != nil {
		if ve, ok := api.AsValidationError(err); ok {
			for _, d := range ve.Shown() {
				fmt.Fprintln(s.err, d)
			}
			n := len(ve.Diagnostics)
			if rest := n - len(ve.Shown()); rest > 0 {
				fmt.Fprintf(s.err, "... and %d more\n", rest)
			}
			fmt.Fprintf(s.err, "%d error%s found\n", n, plural(n))
		} else if ee := (exitError{}); !errors.As(err, &ee) || ee.err != nil {
			fmt.Fprintln(s.err, "vmnetctl:", err)
		}
		var ee exitError
		if errors.As(err, &ee) {
			return ee.code
		}
		return 1
	}
	return 0
}

type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}
func (e exitError) Unwrap() error { return e.err }

func newRootCommand(s streams) *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:   "vmnetctl",
		Short: "Declarative networks for virtual machines",
		Long: `vmnetctl gives virtual machines shared (NAT), host-only and bridged networks,
defined in a lima-compatible networks.yaml, without running the VM as root.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetIn(s.in)
	root.SetOut(s.out)
	root.SetErr(s.err)
	root.PersistentFlags().StringVar(&g.networks, "networks", "", "networks.yaml to use (default $VMNETCTL_NETWORKS, /etc/vmnetctl/networks.yaml, else the built-in defaults)")
	root.PersistentFlags().StringVar(&g.stateDir, "state-dir", statedir.Default(), "directory for vmnetctl's state")
	root.AddCommand(
		newUpCommand(g, s),
		newDownCommand(g, s),
		newPlanCommand(g, s),
		newStatusCommand(g, s),
		newServeCommand(g, s),
		newRunCommand(g, s),
		newArgsCommand(g, s),
		newValidateCommand(g, s),
		newDoctorCommand(g, s),
		newLeasesCommand(g, s),
		newNetworksCommand(g, s),
		newVersionCommand(s),
		newHelperCommand(g, s),
	)
	root.AddCommand(newManCommand(root))
	return root
}

// printWarnings writes warnings to stderr, one per line.
func printWarnings(w io.Writer, diags api.Diagnostics) {
	for _, d := range diags.Warnings().Sorted() {
		fmt.Fprintln(w, d)
	}
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
