package helper

import (
	"fmt"
	"io"

	"github.com/spf13/pflag"

	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// Bind defines the helper's flags on fl, into f: `vmnetctl helper`'s, and
// vmnetctl-helper's (ParseCommandLine).
func (f *Flags) Bind(fl *pflag.FlagSet) {
	fl.IntVar(&f.FD, "fd", -1, "inherited connected unix datagram socket (one end of a socketpair)")
	fl.StringVar(&f.Socket, "socket", "", "create this unix datagram socket and serve the first client that sends to it")
	fl.StringVar(&f.Network, "network", "", "vmnetctl network to join (as vmnetctl networks lists it)")
	fl.StringVar(&f.Mode.OperationMode, "operation-mode", "", "without --network: join the shared, host or bridged network of networks.yaml (default shared)")
	fl.StringVar(&f.Mode.SharedInterface, "shared-interface", "", "host interface of the bridged network (--operation-mode bridged)")
	fl.StringVar(&f.Mode.StartAddress, "start-address", "", "gateway address; with --end-address and --subnet-mask, must match the network")
	fl.StringVar(&f.Mode.EndAddress, "end-address", "", "end of the DHCP range; must match the network")
	fl.StringVar(&f.Mode.SubnetMask, "subnet-mask", "", "subnet mask; must match the network")
	fl.StringVar(&f.InterfaceID, "interface-id", "", "UUID of the interface: the same id gives the same MAC address (default: random)")
	fl.BoolVar(&f.Isolation, "enable-isolation", false, "isolate the VM from the network's other isolated VMs")
	fl.BoolVar(&f.TSO, "enable-tso", false, "TCP segmentation offload: datagrams start with a virtio-net header and carry up to 65550 bytes")
	fl.BoolVar(&f.ChecksumOffload, "enable-checksum-offload", false, "checksum offload: datagrams start with a virtio-net header")
	fl.Float64Var(&f.StatsInterval, "stats-interval", 0, "log stats every SECONDS (default: only when stopping)")
	fl.BoolVarP(&f.Verbose, "verbose", "v", false, "log DEBUG lines")
	fl.StringVar(&f.StatsFile, "stats-file", "", "keep the latest stats line in this file, and log one at most once a minute: vmnetctl's, not vmnet-helper's")
	fl.StringVar(&f.ShapingFile, "shaping-file", "", "delay, jitter, duplicate and reorder the link's frames as this file says (the controller writes it, and signals SIGUSR1 when it changes): vmnetctl's, not vmnet-helper's")
	fl.BoolVar(&f.LogTimestamps, "log-timestamps", false, "start each log line with its time (RFC 3339, UTC): vmnetctl's, not vmnet-helper's")
	fl.BoolVar(&f.PrintVersion, "version", false, "print the version and exit")
	fl.BoolVar(&f.ListSharedInterfaces, "list-shared-interfaces", false, "list the host interfaces a bridged network could use and exit")
	fl.IntVar(&f.UID, "uid", helperproto.SudoID("SUDO_UID"), "run as this user after creating the TAP, and make it the TAP's owner (default $SUDO_UID, else unchanged)")
	fl.IntVar(&f.GID, "gid", helperproto.SudoID("SUDO_GID"), "run as this group (default $SUDO_GID, else the user's primary group)")
	fl.StringVar(&f.Tap, "tap", "", "name of the TAP (default vmt- and a hash of the interface id)")
	fl.StringVar(&f.MAC, "mac", "", "the only MAC address the VM may send from (default: the first it uses)")
	fl.BoolVar(&f.NoSpoofCheck, "no-spoof-check", false, "do not guard the VM's port against spoofing (root only, not through sudo)")
	fl.StringVar(&f.DeleteLink, DeleteLinkFlag, "", "internal: delete this link when stdin closes")
	fl.MarkHidden(DeleteLinkFlag)
	fl.BoolVar(&f.Relearn, RelearnFlag, false, "internal: make the --tap port's guard forget the MAC it learned, and exit")
	fl.MarkHidden(RelearnFlag)
	fl.BoolVar(&f.NoRelayOffloads, NoRelayOffloadsFlag, false, "give a VM without offloads a port without them: no merging or cutting of TCP segments in the relay (the benchmark's comparison)")
	fl.MarkHidden(NoRelayOffloadsFlag)
	fl.StringVar(&f.Attach, "attach", "", "tap: create a persistent TAP for the VMM to open (firecracker, cloud-hypervisor, qemu -netdev tap) and relay nothing; stream: --socket is a stream socket the VMM connects to (qemu -netdev stream, lima's socket: networks); vhost-user: --socket is a vhost-user socket (qemu -netdev vhost-user, cloud-hypervisor vhost_user=true), the frames read from and written to the guest's memory")
}

// ParseCommandLine reads a helper's command line after its program:
// `helper` (optional), the helper's flags, and the global flags a helper
// takes (--networks, --state-dir), as the controller gives them
// (backend/linuxnet.HelperCommand). It is vmnetctl-helper's command line
// (cmd/vmnetctl-helper), and what Prepare reads the helper's options from.
func ParseCommandLine(args []string) (Flags, error) { return parseCommandLine(args, false) }

// parseCommandLine is ParseCommandLine; underController reads it as the
// controller's helper, whose environment has no sudo variables (the
// controller removes them: launch.HelperEnv), whatever this process's has:
// --uid and --gid default to -1.
func parseCommandLine(args []string, underController bool) (Flags, error) {
	if len(args) > 0 && args[0] == "helper" {
		args = args[1:]
	}
	var f Flags
	fl := pflag.NewFlagSet("vmnetctl helper", pflag.ContinueOnError)
	fl.SetOutput(io.Discard)
	f.Bind(fl)
	fl.StringVar(&f.NetworksFile, "networks", "", "networks.yaml to use")
	fl.StringVar(&f.StateDir, "state-dir", statedir.Default(), "directory for vmnetctl's state")
	if err := fl.Parse(args); err != nil {
		return Flags{}, err
	}
	if fl.NArg() > 0 {
		return Flags{}, fmt.Errorf("helper takes no arguments, got %q", fl.Args())
	}
	if underController && !fl.Changed("uid") {
		f.UID = -1
	}
	if underController && !fl.Changed("gid") {
		f.GID = -1
	}
	f.MadeOnDemand = statedir.New(f.StateDir).NetworkMadeOnDemand
	return f, nil
}
