package main

import (
	"github.com/spf13/cobra"
	"github.com/vmnetctl/vmnetctl/ops"
)

func newRunCommand(g *globals, s streams) *cobra.Command {
	f := &vmFileFlags{}
	var vm string
	cmd := command("run -f FILE [--vm NAME] -- COMMAND [ARG]...", "Run a VM command with its network attachments as inherited sockets (fd 4, 5, ...), like vmnet-run",
		cobra.MinimumNArgs(1), func(cmd *cobra.Command, command []string) error {
			in, err := f.input(g)
			if err != nil {
				return err
			}
			code, err := ops.RunVM(cmd.Context(), g.env(s), in, ops.RunOptions{VM: vm, Command: command, Stdin: s.in})
			if err == nil && code != 0 {
				err = exitError{code: code}
			}
			return err
		})
	cmd.Long = `run brings up the VM's networks, makes one socketpair per attachment, starts a
helper on one end of each and COMMAND with the other ends as file descriptors
4, 5, ... (in the order of the VM's networks list; $VMNETCTL_FDS and
$VMNETCTL_MACS list them). When COMMAND exits its helpers stop, and run exits
with COMMAND's status. Under sudo, COMMAND runs as the invoking user.
An attach: tap entry's descriptor is its TAP itself (qemu's -netdev tap,fd=N),
and where the host has vhost-net a vhost-net descriptor follows all the
attachments' ($VMNETCTL_VHOSTFDS): its frames never leave the kernel.

  vmnetctl run -f vms.yaml --vm web -- sh -c 'exec qemu-system-x86_64 ... \
      -netdev dgram,id=net0,local.type=fd,local.str=4 \
      -device virtio-net-pci,netdev=net0,mac=${VMNETCTL_MACS%%,*}'`
	f.bind(cmd, true)
	cmd.Flags().StringVar(&vm, "vm", "", "the VM of the file to run (default: its only VM)")
	return cmd
}
