package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/vmnetctl/vmnetctl/controller"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// VMMs that `args` knows.
var vmms = []string{"qemu", "vfkit", "krunkit", "cloud-hypervisor", "firecracker"}

func newArgsCommand(g *globals, s streams) *cobra.Command {
	var vmm string
	var fds bool
	var mac int
	cmd := &cobra.Command{
		Use:   "args VM [--vmm qemu|vfkit|krunkit|cloud-hypervisor|firecracker] [--fds]",
		Short: "Print the arguments that connect a VMM to the VM's attachments, on one line",
		Long: `args prints the exact arguments a VMM needs to use the VM's attachments, as
` + "`vmnetctl up`" + ` set them up (see docs/vmms.md). With --fds, for qemu under
` + "`vmnetctl run`" + `, the attachments are the inherited descriptors 4, 5, ...
With --mac N it prints only the MAC address of the VM's attachment N.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			vmName := args[0]
			if !slices.Contains(vmms, vmm) {
				return fmt.Errorf("unknown --vmm %q (one of %s)", vmm, strings.Join(vmms, ", "))
			}
			sd := statedir.Dir{Path: g.stateDir}
			st, err := statusOf(cmd, sd)
			if err != nil {
				return err
			}
			var atts []controller.AttachmentStatus
			for _, a := range st.Attachments {
				if a.VM == vmName {
					atts = append(atts, a)
				}
			}
			if len(atts) == 0 {
				return fmt.Errorf("VM %q is not up in %s (vmnetctl up -f FILE)", vmName, sd.Path)
			}
			slices.SortFunc(atts, func(a, b controller.AttachmentStatus) int { return a.Index - b.Index })
			if cmd.Flags().Changed("mac") {
				for _, a := range atts {
					if a.Index == mac {
						fmt.Fprintln(s.out, a.MAC)
						return nil
					}
				}
				return fmt.Errorf("VM %q has no attachment %d", vmName, mac)
			}
			out, err := vmmArgs(sd, vmm, atts, fds)
			if err != nil {
				return err
			}
			fmt.Fprintln(s.out, strings.Join(out, " "))
			return nil
		},
	}
	cmd.Flags().StringVar(&vmm, "vmm", "qemu", "the VMM: "+strings.Join(vmms, ", "))
	cmd.Flags().BoolVar(&fds, "fds", false, "qemu: use the descriptors `vmnetctl run` passes (4, 5, ...) instead of sockets")
	cmd.Flags().IntVar(&mac, "mac", 0, "print only the MAC address of attachment N")
	return cmd
}

func statusOf(cmd *cobra.Command, sd statedir.Dir) (*controller.Status, error) {
	cl := controller.NewClient(sd)
	if cl.Running(cmd.Context()) {
		return cl.Status(cmd.Context())
	}
	return controller.OfflineStatus(cmd.Context(), sd)
}

// vmmArgs builds the arguments for one VMM; each word is shell-quoted.
func vmmArgs(sd statedir.Dir, vmm string, atts []controller.AttachmentStatus, fds bool) ([]string, error) {
	var out []string
	for i, a := range atts {
		id := fmt.Sprintf("net%d", i)
		tap := a.Attach == "tap"
		needTap := vmm == "cloud-hypervisor" || vmm == "firecracker"
		if needTap && !tap {
			return nil, fmt.Errorf("%s opens TAP devices: give %s's entry %d `attach: tap`", vmm, a.VM, a.Index)
		}
		if tap && (vmm == "vfkit" || vmm == "krunkit") {
			return nil, fmt.Errorf("%s uses unix sockets: %s's entry %d is `attach: tap`", vmm, a.VM, a.Index)
		}
		if fds && vmm == "qemu" && !tap {
			// The descriptors of `vmnetctl run` need no socket.
		} else if (tap && a.Tap == "") || (!tap && a.Socket == "") {
			return nil, fmt.Errorf("%s's attachment %d to %s is %s, so it has no %s yet: %s",
				a.VM, a.Index, a.Network, a.State, map[bool]string{true: "TAP", false: "socket"}[tap], a.Error)
		}
		switch vmm {
		case "qemu":
			switch {
			case tap:
				out = append(out, "-netdev", fmt.Sprintf("tap,id=%s,ifname=%s,script=no,downscript=no", id, a.Tap))
			case fds:
				out = append(out, "-netdev", fmt.Sprintf("dgram,id=%s,local.type=fd,local.str=%d", id, controller.FirstVMFD+i))
			default:
				out = append(out, "-netdev", fmt.Sprintf("dgram,id=%s,local.type=unix,local.path=%s,remote.type=unix,remote.path=%s",
					id, sd.ClientSocketPath(a.VM, a.Index), a.Socket))
			}
			out = append(out, "-device", fmt.Sprintf("virtio-net-pci,netdev=%s,mac=%s", id, a.MAC))
		case "vfkit":
			out = append(out, "--device", fmt.Sprintf("virtio-net,unixSocketPath=%s,mac=%s", a.Socket, a.MAC))
		case "krunkit":
			out = append(out, "--device", fmt.Sprintf("virtio-net,type=unixgram,path=%s,mac=%s", a.Socket, a.MAC))
		case "cloud-hypervisor":
			if i == 0 {
				out = append(out, "--net")
			}
			out = append(out, fmt.Sprintf("tap=%s,mac=%s", a.Tap, a.MAC))
		case "firecracker":
			// firecracker takes interfaces in its JSON config or API: print
			// the network-interfaces entries.
			out = append(out, fmt.Sprintf(`{"iface_id":%s,"host_dev_name":%s,"guest_mac":%s}`, strconv.Quote(id), strconv.Quote(a.Tap), strconv.Quote(a.MAC)))
		}
	}
	if vmm == "firecracker" {
		return []string{"[" + strings.Join(out, ",") + "]"}, nil
	}
	for i, w := range out {
		out[i] = shellQuote(w)
	}
	return out, nil
}

// shellQuote quotes a word for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=,@%+", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
