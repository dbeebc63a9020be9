package main

import (
	"context"
	"fmt"
	"os"
	"slices"

	"github.com/spf13/cobra"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/controller"
	"github.com/vmnetctl/vmnetctl/statedir"
)

func newRunCommand(g *globals, s streams) *cobra.Command {
	f := &projectFlags{}
	var vmName string
	cmd := &cobra.Command{
		Use:   "run -f FILE [--vm NAME] -- COMMAND [ARG]...",
		Short: "Run a VM command with its network attachments as inherited sockets (fd 4, 5, ...), like vmnet-run",
		Long: `run brings up the VM's networks, makes one socketpair per attachment, starts a
helper on one end of each and COMMAND with the other ends as file descriptors
4, 5, ... (in the order of the VM's networks list; $VMNETCTL_FDS and
$VMNETCTL_MACS list them). When COMMAND exits its helpers stop, and run exits
with COMMAND's status. Under sudo, COMMAND runs as the invoking user.

  vmnetctl run -f vms.yaml --vm web -- sh -c 'exec qemu-system-x86_64 ... \
      -netdev dgram,id=net0,local.type=fd,local.str=4 \
      -device virtio-net-pci,netdev=net0,mac=${VMNETCTL_MACS%%,*}'`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, command []string) error {
			ctx := cmd.Context()
			p, snap, nets, err := loadProject(g, f, s)
			if err != nil {
				return err
			}
			own, err := controller.ComputeDesired(nets, []*statedir.Project{p})
			if err != nil {
				return err
			}
			var vms []string
			for _, a := range own.Attachments {
				if !slices.Contains(vms, a.VM) {
					vms = append(vms, a.VM)
				}
			}
			switch {
			case vmName == "" && len(vms) == 1:
				vmName = vms[0]
			case vmName == "":
				return fmt.Errorf("the file has %d VMs with networks (%v); choose one with --vm", len(vms), vms)
			case !slices.Contains(vms, vmName):
				return fmt.Errorf("VM %q has no network attachments in the file (VMs: %v)", vmName, vms)
			}
			p.OnlyVMs, p.External = []string{vmName}, true
			if f.project == "" {
				p.Name = "run-" + vmName
			}
			sd := statedir.Dir{Path: g.stateDir}
			var atts []*controller.Attachment
			err = func() error {
				lock, err := sd.LockOps()
				if err != nil {
					return err
				}
				defer lock.Unlock()
				existing, err := sd.Projects()
				if err != nil {
					return err
				}
				d, err := controller.ComputeDesired(nets, withProject(existing, p))
				if err != nil {
					return err
				}
				for _, a := range d.Attachments {
					if a.VM == vmName {
						atts = append(atts, a)
					}
				}
				if err := sd.SaveNetworks(*snap); err != nil {
					return err
				}
				if err := sd.SaveProject(p); err != nil {
					return err
				}
				resp, err := reconcile(ctx, sd)
				if err != nil {
					return err
				}
				for _, n := range resp.Status.Networks {
					for _, a := range atts {
						if a.Network == n.Name && n.State != "up" {
							return fmt.Errorf("network %s is not up: %s", n.Name, n.Error)
						}
					}
				}
				return nil
			}()
			if err != nil {
				removeProject(context.WithoutCancel(ctx), sd, p.Name)
				return err
			}
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			cl := controller.NewClient(sd)
			byID := map[string]*api.Network{}
			for _, n := range nets.Networks {
				byID[n.ID] = n
			}
			code, runErr := controller.RunVM(ctx, sd, p, atts, byID, command, controller.RunOptions{
				Executable: exe, Stdin: s.in, Stdout: s.out, Stderr: s.err, VMNetHelperPath: nets.Paths.VMNetHelper,
				// Let the controller watch run's helpers (status, metrics).
				OnReady: func() { go cl.Reconcile(context.WithoutCancel(ctx)) },
			})
			removeProject(context.WithoutCancel(ctx), sd, p.Name)
			if runErr != nil {
				return runErr
			}
			if code != 0 {
				return exitError{code: code}
			}
			return nil
		},
	}
	f.bind(cmd)
	cmd.Flags().StringVar(&vmName, "vm", "", "the VM of the file to run (default: its only VM)")
	return cmd
}

// removeProject removes a project and lets the controller converge.
func removeProject(ctx context.Context, sd statedir.Dir, name string) {
	lock, err := sd.LockOps()
	if err != nil {
		return
	}
	defer lock.Unlock()
	if existed, _ := sd.DeleteProject(name); existed {
		reconcile(ctx, sd)
	}
}
