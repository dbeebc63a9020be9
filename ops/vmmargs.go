package ops

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/vmnetctl/vmnetctl/backend"
	"github.com/vmnetctl/vmnetctl/backends"
	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/launch"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// VMMs are the VMMs whose arguments VMMArgs knows.
var VMMs = []string{"qemu", "vfkit", "krunkit", "cloud-hypervisor", "firecracker", "lima"}

// VMAttachments returns the attachments of a VM that is up, by index.
func VMAttachments(ctx context.Context, sd statedir.Dir, vm string) ([]ctlapi.AttachmentStatus, error) {
	st, err := CurrentStatus(ctx, sd)
	if err != nil {
		return nil, err
	}
	var atts []ctlapi.AttachmentStatus
	var up []string
	for _, a := range st.Attachments {
		if a.VM == vm {
			atts = append(atts, a)
		}
		if !slices.Contains(up, a.VM) {
			up = append(up, a.VM)
		}
	}
	if len(atts) == 0 {
		suggest := ""
		if len(up) > 0 {
			slices.Sort(up)
			suggest = fmt.Sprintf("; VMs that are up: %v", up)
		}
		return nil, fmt.Errorf("VM %q is not up in %s (vmnetctl up -f FILE)%s", vm, sd.Path, suggest)
	}
	slices.SortFunc(atts, func(a, b ctlapi.AttachmentStatus) int { return a.Index - b.Index })
	return atts, nil
}

// AttachmentMAC is `vmnetctl args VM --mac N`: the MAC address of the VM's
// attachment N.
func AttachmentMAC(ctx context.Context, sd statedir.Dir, vm string, index int) (string, error) {
	atts, err := VMAttachments(ctx, sd, vm)
	if err != nil {
		return "", err
	}
	for _, a := range atts {
		if a.Index == index {
			return a.MAC, nil
		}
	}
	return "", fmt.Errorf("VM %q has no attachment %d", vm, index)
}

// VMMArgs is `vmnetctl args`: the arguments that connect vmm to the VM's
// attachments, as `up` set them up, each word shell-quoted. With fds, for
// qemu under `vmnetctl run`, the attachments are the inherited descriptors
// 4, 5, ... memory is the guest's memory size (qemu's -m: 2G, 512M), which
// a vhost-user attachment needs shared with its helper.
func VMMArgs(ctx context.Context, sd statedir.Dir, vm, vmm string, fds bool, memory string) ([]string, error) {
	if !slices.Contains(VMMs, vmm) {
		return nil, fmt.Errorf("unknown --vmm %q (one of %s)", vmm, strings.Join(VMMs, ", "))
	}
	atts, err := VMAttachments(ctx, sd, vm)
	if err != nil {
		return nil, err
	}
	th, ok := backends.Default().(backend.TAPHandler)
	return vmmArgs(sd, vmm, atts, fds, ok && th.Vhost(), memory)
}

// vmmArgs are the words of VMMArgs; vhost: the host has vhost-net, which
// `vmnetctl run` then passes for TAP attachments.
func vmmArgs(sd statedir.Dir, vmm string, atts []ctlapi.AttachmentStatus, fds, vhost bool, memory string) ([]string, error) {
	var out []string
	sharedMemory := false // (qemu's, once for every vhost-user attachment)
	var taps []bool
	for _, a := range atts {
		taps = append(taps, a.Attach == "tap")
	}
	runFDs, vhostFDs := launch.RunFDs(taps, vhost)
	for i, a := range atts {
		if err := checkVMMAttachment(vmm, a, fds); err != nil {
			return nil, err
		}
		id := fmt.Sprintf("net%d", i)
		tap := a.Attach == "tap"
		switch vmm {
		case "qemu":
			switch {
			case a.Attach == "vhost-user":
				if !sharedMemory {
					if memory == "" {
						return nil, fmt.Errorf("%s's entry %d is `attach: vhost-user`, whose helper reads the guest's memory: give --memory with the guest's -m (2G, 512M), which the arguments share", a.VM, a.Index)
					}
					out = append(out, "-object", "memory-backend-memfd,id=vmnetctl-mem,size="+qemuValue(memory)+",share=on", "-machine", "memory-backend=vmnetctl-mem")
					sharedMemory = true
				}
				// reconnect: a helper started again is connected again.
				out = append(out, "-chardev", fmt.Sprintf("socket,id=%s-vu,path=%s,reconnect=1", id, qemuValue(a.Socket)),
					"-netdev", fmt.Sprintf("vhost-user,id=%s,chardev=%s-vu", id, id))
			case a.Attach == "stream" && !fds:
				out = append(out, "-netdev", fmt.Sprintf("stream,id=%s,server=off,addr.type=unix,addr.path=%s", id, qemuValue(a.Socket)))
			case tap && fds && vhostFDs[i] >= 0:
				out = append(out, "-netdev", fmt.Sprintf("tap,id=%s,fd=%d,vhost=on,vhostfd=%d", id, runFDs[i], vhostFDs[i]))
			case tap && fds:
				out = append(out, "-netdev", fmt.Sprintf("tap,id=%s,fd=%d", id, runFDs[i]))
			case tap:
				out = append(out, "-netdev", fmt.Sprintf("tap,id=%s,ifname=%s,script=no,downscript=no", id, a.Tap))
			case fds:
				out = append(out, "-netdev", fmt.Sprintf("dgram,id=%s,local.type=fd,local.str=%d", id, runFDs[i]))
			default:
				// qemu's option syntax: a comma in a value is doubled.
				out = append(out, "-netdev", fmt.Sprintf("dgram,id=%s,local.type=unix,local.path=%s,remote.type=unix,remote.path=%s",
					id, qemuValue(sd.ClientSocketPath(a.VM, a.Index)), qemuValue(a.Socket)))
			}
			out = append(out, "-device", fmt.Sprintf("virtio-net-pci,netdev=%s,mac=%s", id, a.MAC))
		case "lima":
			// An entry of the lima instance's `networks:` (lima.yaml):
			// lima's qemu connects to the socket as to socket_vmnet's.
			out = append(out, fmt.Sprintf("- socket: %s\n  macAddress: %s", strconv.Quote(a.Socket), strconv.Quote(a.MAC)))
		case "vfkit":
			out = append(out, "--device", fmt.Sprintf("virtio-net,unixSocketPath=%s,mac=%s", a.Socket, a.MAC))
		case "krunkit":
			out = append(out, "--device", fmt.Sprintf("virtio-net,type=unixgram,path=%s,mac=%s", a.Socket, a.MAC))
		case "cloud-hypervisor":
			if i == 0 {
				out = append(out, "--net")
			}
			if a.Attach == "vhost-user" {
				// (with --memory shared=on: docs/vmms.md)
				out = append(out, fmt.Sprintf("vhost_user=true,socket=%s,vhost_mode=client,mac=%s", a.Socket, a.MAC))
				continue
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
	if vmm == "lima" {
		return []string{"networks:\n" + strings.Join(out, "\n")}, nil
	}
	for i, w := range out {
		out[i] = shellQuote(w)
	}
	return out, nil
}

// checkVMMAttachment tells why vmm cannot use attachment a.
func checkVMMAttachment(vmm string, a ctlapi.AttachmentStatus, fds bool) error {
	tap := a.Attach == "tap"
	stream := a.Attach == "stream"
	switch {
	case a.Attach == "vhost-user" && vmm != "qemu" && vmm != "cloud-hypervisor":
		return fmt.Errorf("%s does not speak vhost-user: %s's entry %d is `attach: vhost-user` (qemu and cloud-hypervisor do)", vmm, a.VM, a.Index)
	case a.Attach == "vhost-user" && fds:
		return fmt.Errorf("%s's entry %d is `attach: vhost-user`: qemu connects to its helper's socket, with no descriptor from `vmnetctl run`", a.VM, a.Index)
	case vmm == "lima" && !stream:
		return fmt.Errorf("lima on Linux connects its VMs to stream sockets (its `socket:` networks): give %s's entry %d `attach: stream`", a.VM, a.Index)
	case stream && vmm != "qemu" && vmm != "lima":
		return fmt.Errorf("%s does not speak qemu's stream sockets: %s's entry %d is `attach: stream`", vmm, a.VM, a.Index)
	case (vmm == "cloud-hypervisor" || vmm == "firecracker") && !tap && a.Attach != "vhost-user":
		return fmt.Errorf("%s opens TAP devices: give %s's entry %d `attach: tap`", vmm, a.VM, a.Index)
	case tap && (vmm == "vfkit" || vmm == "krunkit"):
		return fmt.Errorf("%s uses unix sockets: %s's entry %d is `attach: tap`", vmm, a.VM, a.Index)
	case (vmm == "vfkit" || vmm == "krunkit") && strings.Contains(a.Socket, ","):
		// Their --device options are split at commas, with no escape: a
		// comma in the path would start an option of the path's choosing.
		return fmt.Errorf("%s cannot take the socket %s: its path has a comma (choose a state dir without one)", vmm, a.Socket)
	case fds && vmm == "qemu":
		return nil // the descriptors of `vmnetctl run` need no socket or TAP name
	case (tap && a.Tap == "") || (!tap && a.Socket == ""):
		return fmt.Errorf("%s's attachment %d to %s is %s, so it has no %s yet: %s",
			a.VM, a.Index, a.Network, a.State, map[bool]string{true: "TAP", false: "socket"}[tap], a.Error)
	}
	return nil
}

// qemuValue escapes a value in a qemu option string: a comma would end the
// value and start an option of the value's choosing, so it is doubled.
func qemuValue(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// shellQuote quotes a word for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=,@%+", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
