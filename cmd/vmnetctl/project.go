package main

import (
	"encoding/json"
	"io"

	"github.com/spf13/cobra"

	"github.com/vmnetctl/vmnetctl/controller"
	"github.com/vmnetctl/vmnetctl/statedir"
)

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
	}
}

// input reads networks.yaml and the VM files the flags name.
func (f *vmFileFlags) input(g *globals) (*controller.Input, error) {
	return controller.ReadInput(g.networks, f.files, f.name, f.project)
}

// env is where a command's operation runs and reports.
func (g *globals) env(s streams) controller.Env {
	return controller.Env{StateDir: statedir.Dir{Path: g.stateDir}, Stdout: s.out, Stderr: s.err}
}

// backendFlag is --backend: whose limits validate and plan warn about.
func bindBackend(cmd *cobra.Command, name *string) {
	cmd.Flags().StringVar(name, "backend", controller.DefaultBackend().Name(),
		"warn about what this backend cannot honour: vmnetctl (Linux) or vmnet-helper (macOS)")
}

// printJSON writes v as indented JSON.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
