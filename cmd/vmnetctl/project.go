package main

import (
	"fmt"
	"os"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/config"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// projectFlags are the flags of up, down and plan.
type projectFlags struct {
	vmFileFlags
	project string
}

func (f *projectFlags) bind(cmd *cobra.Command) {
	f.vmFileFlags.bind(cmd)
	cmd.Flags().StringVarP(&f.project, "project", "p", "", "project name (default: the VM's name for a lima instance file, else the first file's name)")
}

// loadProject reads networks.yaml and the VM files, validates them, and
// returns them as a project plus the networks snapshot to record. The bytes
// validated are the bytes stored.
func loadProject(g *globals, f *projectFlags, s streams) (*statedir.Project, *statedir.NetworksSnapshot, *api.Networks, error) {
	if len(f.files) == 0 {
		return nil, nil, nil, fmt.Errorf("no VM file given (-f FILE)")
	}
	source, data, err := config.ReadNetworks(g.networks)
	if err != nil {
		return nil, nil, nil, err
	}
	nets, diags := api.LoadNetworks(source, data)
	p := &statedir.Project{VMName: f.name, UID: ownerID("SUDO_UID", os.Getuid()), GID: ownerID("SUDO_GID", os.Getgid())}
	var files []*api.VMFile
	for _, path := range f.files {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("reading VM file: %w", err)
		}
		p.Files = append(p.Files, statedir.ProjectFile{Path: path, Data: b})
		vf, d := api.LoadVMFile(path, b, api.VMFileOptions{Name: f.name})
		diags = append(diags, d...)
		if vf != nil {
			files = append(files, vf)
		}
	}
	if nets != nil {
		diags = append(diags, api.Resolve(nets, files)...)
	}
	printWarnings(s.err, diags)
	if err := diags.Err(); err != nil {
		return nil, nil, nil, err
	}
	p.Name = f.project
	if p.Name == "" {
		p.Name = statedir.ProjectName(files)
	}
	return p, &statedir.NetworksSnapshot{Source: source, Data: data}, nets, nil
}

// ownerID is the id of the user behind sudo, else fallback.
func ownerID(env string, fallback int) int {
	if v, err := strconv.Atoi(os.Getenv(env)); err == nil && v >= 0 {
		return v
	}
	return fallback
}

// projectName is the project that down or plan names with -p or -f.
func projectName(g *globals, f *projectFlags) (string, error) {
	if f.project != "" {
		return f.project, nil
	}
	if len(f.files) == 0 {
		return "", fmt.Errorf("name a project with -p NAME or -f FILE")
	}
	var files []*api.VMFile
	for _, path := range f.files {
		b, err := os.ReadFile(path)
		if err != nil {
			return "", fmt.Errorf("reading VM file: %w", err)
		}
		vf, diags := api.LoadVMFile(path, b, api.VMFileOptions{Name: f.name})
		if vf == nil {
			return "", diags.Err()
		}
		files = append(files, vf)
	}
	return statedir.ProjectName(files), nil
}

// withProject returns the projects with p added or replaced.
func withProject(projects []*statedir.Project, p *statedir.Project) []*statedir.Project {
	out := []*statedir.Project{p}
	for _, q := range projects {
		if q.Name != p.Name {
			out = append(out, q)
		}
	}
	return out
}
