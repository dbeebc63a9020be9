package main

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/pflag"

	"github.com/spf13/cobra"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/ops"
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
		Example: `  vmnetctl networks                  # the networks of networks.yaml
  sudo vmnetctl up -f vms.yaml       # bring the VMs' networks and helpers up
  vmnetctl args web --vmm qemu       # the VMM's network arguments for VM web
  sudo vmnetctl status
  sudo vmnetctl down -f vms.yaml
  sudo vmnetctl doctor               # what this host lacks or has in the way`,
		Use:   "vmnetctl",
		Short: "Declarative networks for virtual machines",
		Long: `vmnetctl gives virtual machines shared (NAT), host-only and bridged networks,
defined in a lima-compatible networks.yaml, without running the VM as root.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version,
	}
	root.SetIn(s.in)
	root.SetOut(s.out)
	root.SetErr(s.err)
	root.PersistentFlags().StringVar(&g.networks, "networks", "", "networks.yaml to use (default $VMNETCTL_NETWORKS, /etc/vmnetctl/networks.yaml, else the built-in defaults)")
	root.PersistentFlags().StringVar(&g.stateDir, "state-dir", statedir.Default(), "directory for vmnetctl's state")
	// Help and the man pages describe the default, not this user's value:
	// pages built by a user must not carry the builder's runtime dir.
	root.PersistentFlags().Lookup("state-dir").DefValue = stateDirDefault
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
		newLogsCommand(g, s),
		newDescribeCommand(g, s),
		newEventsCommand(g, s),
		newNetworkCommand(g, s),
		newNetworksCommand(g, s),
		newVersionCommand(s),
		newHelperCommand(g, s),
		newWireGuardCommand(g, s),
		newCaptureCommand(g, s),
		newImpairCommand(g, s),
	)
	root.AddCommand(newManCommand(root))
	// The completion command, made now (not at Execute) to carry Examples.
	root.InitDefaultCompletionCmd()
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			path := commandPath(sub)
			if sub.Example == "" {
				sub.Example = examples[path]
			}
			// A verb that reads the state dir says what to do when this
			// user may not (permission denied).
			if run := sub.RunE; run != nil && flagActs("state-dir", path) {
				sub.RunE = func(c *cobra.Command, args []string) error {
					return ops.AccessHint(run(c, args))
				}
			}
			walk(sub)
		}
	}
	walk(root)
	// Help shows a global flag only on the commands it acts on.
	defaultHelp := root.HelpFunc()
	root.SetHelpFunc(func(c *cobra.Command, args []string) {
		var hidden []*pflag.Flag
		for flag := range globalFlagActs {
			if f := root.PersistentFlags().Lookup(flag); f != nil && c != root && !flagActs(flag, commandPath(c)) && !f.Hidden {
				f.Hidden = true
				hidden = append(hidden, f)
			}
		}
		defaultHelp(c, args)
		for _, f := range hidden {
			f.Hidden = false
		}
	})
	return root
}

// stateDirDefault is how help describes --state-dir's default
// (statedir.Default).
const stateDirDefault = "/run/vmnetctl as root, else $XDG_RUNTIME_DIR/vmnetctl"

// commandPath is c's command line without "vmnetctl": "network delete".
func commandPath(c *cobra.Command) string {
	_, path, _ := strings.Cut(c.CommandPath(), " ")
	return path
}

// flagActs says whether global flag acts on the command at path (as
// commandPath gives it): one globalFlagActs names, or a subcommand of one.
func flagActs(flag, path string) bool {
	for _, c := range globalFlagActs[flag] {
		if path == c || strings.HasPrefix(path, c+" ") {
			return true
		}
	}
	return false
}

// globalFlagActs names, for each global flag, the commands (and with them
// their subcommands) it acts on: help shows it there only, and errors of
// the commands that read the state dir get ops.AccessHint.
var globalFlagActs = map[string][]string{
	"networks":  {"up", "plan", "run", "validate", "networks", "network list", "network create", "network inspect", "doctor", "helper"},
	"state-dir": {"up", "down", "plan", "status", "serve", "run", "args", "validate", "leases", "logs", "describe", "events", "network", "completion", "helper", "doctor", "wireguard"},
}

// examples are the commands' Examples sections (`vmnetctl CMD --help`),
// where the command does not set its own.
var examples = map[string]string{
	"up":     "  sudo vmnetctl up -f vms.yaml\n  sudo vmnetctl up -f ~/.lima/default/lima.yaml --json\n  sudo vmnetctl up -f vms.yaml --networks ~/.lima/_config/networks.yaml",
	"down":   "  sudo vmnetctl down -f vms.yaml\n  sudo vmnetctl down -p vms      # the project of vms.yaml\n  sudo vmnetctl down --all",
	"plan":   "  sudo vmnetctl plan -f vms.yaml\n  sudo vmnetctl plan -f vms.yaml --detailed-exitcode   # exit 2 when up would change something",
	"status": "  sudo vmnetctl status\n  sudo vmnetctl status --json | jq '.attachments[] | {vm, ip, state}'",
	"serve":  "  sudo vmnetctl serve                     # as a service (packaging/vmnetctl.service)\n  sudo vmnetctl serve --group vmnetctl    # members of group vmnetctl may use status and args",
	"run": "  sudo vmnetctl run -f run.yaml --vm b -- sh -c 'echo \"fds $VMNETCTL_FDS, MACs $VMNETCTL_MACS\"'\n" +
		"  sudo vmnetctl run -f run.yaml --vm b -- sh -c 'exec qemu-system-x86_64 ... -netdev dgram,id=net0,local.type=fd,local.str=4 -device virtio-net-pci,netdev=net0,mac=${VMNETCTL_MACS%%,*}'",
	"validate":              "  vmnetctl validate -f vms.yaml\n  vmnetctl validate -f lima.yaml --networks ~/.lima/_config/networks.yaml --backend vmnet-helper",
	"networks":              "  vmnetctl networks\n  vmnetctl networks --networks ~/.lima/_config/networks.yaml --json",
	"doctor":                "  sudo vmnetctl doctor\n  sudo vmnetctl doctor --json",
	"version":               "  vmnetctl version\n  vmnetctl --version",
	"wireguard":             "  sudo vmnetctl wireguard pubkey",
	"wireguard pubkey":      "  sudo vmnetctl wireguard pubkey",
	"helper":                "  sudo vmnetctl helper --network shared --socket /tmp/vm.sock --interface-id $(uuidgen)",
	"completion":            "  source <(vmnetctl completion bash)\n  vmnetctl completion zsh > \"${fpath[1]}/_vmnetctl\"\n  vmnetctl completion fish > ~/.config/fish/completions/vmnetctl.fish",
	"completion bash":       "  source <(vmnetctl completion bash)\n  vmnetctl completion bash > /etc/bash_completion.d/vmnetctl",
	"completion zsh":        "  vmnetctl completion zsh > \"${fpath[1]}/_vmnetctl\"",
	"completion fish":       "  vmnetctl completion fish > ~/.config/fish/completions/vmnetctl.fish",
	"completion powershell": "  vmnetctl completion powershell | Out-String | Invoke-Expression",
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
