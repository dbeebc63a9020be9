package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/vmnetctl/vmnetctl/ops"
)

// vmmArgs is `vmnetctl args --json`: line is what the command prints
// without --json (shell-quoted words; for firecracker its JSON, for lima
// its YAML).
type vmmArgs struct {
	VM   string `json:"vm"`
	VMM  string `json:"vmm"`
	Line string `json:"line"`
}

func newArgsCommand(g *globals, s streams) *cobra.Command {
	out := &output{}
	var vmm string
	var fds bool
	var mac int
	var memory string
	cmd := command("args VM [--vmm qemu|vfkit|krunkit|cloud-hypervisor|firecracker|lima] [--fds]", "Print the arguments that connect a VMM to the VM's attachments, on one line",
		cobra.ExactArgs(1), func(cmd *cobra.Command, args []string) error {
			sd := g.dir()
			if cmd.Flags().Changed("mac") {
				m, err := ops.AttachmentMAC(cmd.Context(), sd, args[0], mac)
				if err == nil {
					fmt.Fprintln(s.out, m)
				}
				return err
			}
			words, err := ops.VMMArgs(cmd.Context(), sd, args[0], vmm, fds, memory)
			if err != nil {
				return err
			}
			line := strings.Join(words, " ")
			return out.print(s.out, vmmArgs{VM: args[0], VMM: vmm, Line: line}, func(w io.Writer) error {
				_, err := fmt.Fprintln(w, line)
				return err
			})
		})
	cmd.Long = `args prints the exact arguments a VMM needs to use the VM's attachments, as
` + "`vmnetctl up`" + ` set them up (see docs/vmms.md). With --fds, for qemu under
` + "`vmnetctl run`" + `, the attachments are the inherited descriptors 4, 5, ...
With --vmm lima it prints the networks: list of a lima instance (lima.yaml)
whose attachments are ` + "`attach: stream`" + ` (lima's socket: networks on Linux).
For ` + "`attach: vhost-user`" + ` (qemu, cloud-hypervisor), qemu's arguments share the
guest's memory with the helper: --memory gives its size, the same as -m.
With --mac N it prints only the MAC address of the VM's attachment N.`
	cmd.ValidArgsFunction = completeVMs(g)
	cmd.Example = "  vmnetctl args web --vmm qemu\n  vmnetctl args web --vmm vfkit"
	out.bind(cmd, "print JSON: {vm, vmm, line}")
	cmd.Flags().StringVar(&vmm, "vmm", "qemu", "the VMM: "+strings.Join(ops.VMMs, ", "))
	cmd.Flags().BoolVar(&fds, "fds", false, "qemu: use the descriptors that vmnetctl run passes (4, 5, ...) instead of sockets")
	cmd.Flags().IntVar(&mac, "mac", 0, "print only the MAC address of attachment N")
	cmd.Flags().StringVar(&memory, "memory", "", "qemu, attach: vhost-user: the guest's memory, as its -m (2G, 512M), which the arguments share with the helper")
	return cmd
}
