package main

import (
	"encoding/json"
	"io"

	"github.com/spf13/cobra"

	"github.com/vmnetctl/vmnetctl/backends"
	"github.com/vmnetctl/vmnetctl/ops"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// command is one vmnetctl command: its usage, help, argument rule and what
// it runs. Flags are bound on the result.
func command(use, short string, args cobra.PositionalArgs, run func(cmd *cobra.Command, args []string) error) *cobra.Command {
	return &cobra.Command{Use: use, Short: short, Args: args, RunE: run}
}

// vmFileFlags are the flags of every command that reads VM files.
type vmFileFlags struct {
	files   []string
	name    string
	project string
}

func (f *vmFileFlags) bind(cmd *cobra.Command, withProject bool) {
	cmd.Flags().StringArrayVarP(&f.files, "file", "f", nil, "VM file: a lima instance file (networks: list) or a multi-VM file (vms: map); repeatable")
	cmd.Flags().StringVar(&f.name, "name", "", "VM name for a lima instance file (default: the file's directory name)")
	if withProject {
		cmd.Flags().StringVarP(&f.project, "project", "p", "", "project name (default: the VM's name for a lima instance file, else the first file's name)")
		cmd.RegisterFlagCompletionFunc("project", f.completeProjects)
	}
}

// completeProjects completes -p with the projects of the state dir: the
// global --state-dir as given on the line being completed.
func (f *vmFileFlags) completeProjects(cmd *cobra.Command, _ []string, _ string) ([]string, cobra.ShellCompDirective) {
	dir := statedir.Default()
	if fl := cmd.Flag("state-dir"); fl != nil && fl.Changed {
		dir = fl.Value.String()
	}
	return ops.ProjectNames(statedir.New(dir)), cobra.ShellCompDirectiveNoFileComp
}

// input reads networks.yaml and the VM files the flags name.
func (f *vmFileFlags) input(g *globals) (*ops.Input, error) {
	return ops.ReadInput(g.networks, f.files, f.name, f.project)
}

// env is where a command's operation runs and reports.
func (g *globals) env(s streams) ops.Env {
	return ops.Env{StateDir: g.dir(), Stdout: s.out, Stderr: s.err}
}

func (g *globals) dir() statedir.Dir { return statedir.New(g.stateDir) }

// bindBackend binds --backend: the backend whose limits validate and plan
// check.
func bindBackend(cmd *cobra.Command, name *string) {
	cmd.Flags().StringVar(name, "backend", backends.Default().Name(),
		"check against this backend, vmnetctl (Linux) or vmnet-helper (macOS): what it would refuse is an error, what it cannot honour a warning")
}

// output is --json: a command's result as JSON, or rendered for people.
type output struct{ json bool }

func (o *output) bind(cmd *cobra.Command, help string) {
	cmd.Flags().BoolVar(&o.json, "json", false, help)
}

// progress is where a long command draws its progress: w if it is a
// terminal and the output is not JSON, else nowhere (nil).
func (o output) progress(w io.Writer) io.Writer {
	if o.json || !isTerminal(w) {
		return nil
	}
	return w
}

// print writes v as indented JSON with --json, else as render writes it.
func (o output) print(w io.Writer, v any, render func(io.Writer) error) error {
	if !o.json {
		return render(w)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
