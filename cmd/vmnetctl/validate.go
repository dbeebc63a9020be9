package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/config"
	"github.com/vmnetctl/vmnetctl/controller"
)

// vmFileFlags are the flags of every command that reads VM files.
type vmFileFlags struct {
	files []string
	name  string
}

func (f *vmFileFlags) bind(cmd *cobra.Command) {
	cmd.Flags().StringArrayVarP(&f.files, "file", "f", nil, "VM file: a lima instance file (networks: list) or a multi-VM file (vms: map); repeatable")
	cmd.Flags().StringVar(&f.name, "name", "", "VM name for a lima instance file (default: the file's directory name)")
}

// loadDesired reads networks.yaml and the VM files, and reports every problem at once.
func loadDesired(g *globals, f *vmFileFlags) (*api.Networks, []*api.VMFile, api.Diagnostics, error) {
	nets, diags, err := config.LoadNetworks(g.networks)
	if err != nil && !isValidation(err) {
		return nil, nil, diags, err
	}
	// The VM files are read even when networks.yaml has errors, so that one
	// run reports the problems of both.
	files, vdiags, verr := config.LoadVMFiles(nets, f.files, api.VMFileOptions{Name: f.name})
	diags = append(diags, vdiags...)
	if err != nil || verr != nil {
		if verr != nil && !isValidation(verr) {
			return nil, nil, diags, verr
		}
		return nil, nil, diags, diags.Err()
	}
	return nets, files, diags, nil
}

func isValidation(err error) bool {
	_, ok := api.AsValidationError(err)
	return ok
}

// backendFlag is --backend: whose limits validate and plan warn about.
type backendFlag struct{ name string }

func (b *backendFlag) bind(cmd *cobra.Command) {
	cmd.Flags().StringVar(&b.name, "backend", controller.DefaultBackend().Name(),
		"warn about what this backend cannot honour: vmnetctl (Linux) or vmnet-helper (macOS)")
}

// warnBackend prints the backend's warnings for nets and atts on w.
func warnBackend(w io.Writer, b *backendFlag, nets []*api.Network, atts []*api.Attachment) error {
	be, err := controller.BackendByName(b.name)
	if err != nil {
		return err
	}
	for _, msg := range be.Limits(nets, atts) {
		fmt.Fprintln(w, "warning:", msg)
	}
	return nil
}

func newValidateCommand(g *globals, s streams) *cobra.Command {
	f := &vmFileFlags{}
	be := &backendFlag{}
	cmd := &cobra.Command{
		Use:   "validate [-f FILE]... [--networks FILE]",
		Short: "Check networks.yaml and VM files, reporting every problem with its file and line",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			nets, files, diags, err := loadDesired(g, f)
			printWarnings(s.err, diags)
			if err != nil {
				return err
			}
			var atts []*api.Attachment
			for _, vf := range files {
				for _, vm := range vf.VMs {
					atts = append(atts, vm.Attachments...)
				}
			}
			if err := warnBackend(s.err, be, nets.Networks, atts); err != nil {
				return err
			}
			fmt.Fprintf(s.out, "%s: %d network%s, valid\n", nets.Source, len(nets.Networks), plural(len(nets.Networks)))
			for _, vf := range files {
				fmt.Fprintf(s.out, "%s: %d VM%s, valid\n", vf.File, len(vf.VMs), plural(len(vf.VMs)))
			}
			if len(files) == 0 {
				return nil
			}
			tw := tabwriter.NewWriter(s.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "VM\tNETWORK\tMAC\tATTACH\tIP\tINTERFACE")
			for _, vf := range files {
				for _, vm := range vf.VMs {
					for _, a := range vm.Attachments {
						ip := "dhcp"
						if a.IP.IsValid() {
							ip = a.IP.String()
						}
						fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", vm.Name, a.Network, a.MAC, a.Attach, ip, a.Interface)
					}
				}
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			for _, vf := range files {
				for _, vm := range vf.VMs {
					for _, sk := range vm.Skipped {
						fmt.Fprintf(s.out, "%s: skipping entry %d (%s): %s\n", vm.Name, sk.Index, sk.Entry, sk.Reason)
					}
				}
			}
			return nil
		},
	}
	f.bind(cmd)
	be.bind(cmd)
	return cmd
}
