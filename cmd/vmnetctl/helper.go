package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/config"
	"github.com/vmnetctl/vmnetctl/helper"
)

// helperFlags are vmnet-helper's flags, plus --uid, --gid, --tap and --attach.
type helperFlags struct {
	fd                   int
	socket               string
	network              string
	mode                 helper.ModeFlags
	interfaceID          string
	isolation            bool
	tso, csum            bool
	statsInterval        float64
	verbose              bool
	version              bool
	listSharedInterfaces bool
	uid, gid             int
	tap                  string
	attach               string
	deleteLink           string
}

func newHelperCommand(g *globals, s streams) *cobra.Command {
	f := &helperFlags{}
	cmd := &cobra.Command{
		Use:   "helper (--fd FD | --socket PATH | --attach tap) [--network NAME | --operation-mode MODE]",
		Short: "Connect one VM to a network: vmnet-helper's contract on Linux (see docs/helper.md)",
		Long: `helper creates the VM's TAP on a vmnetctl network's bridge and relays Ethernet
frames between it and the VM process over a unix datagram socket, one frame per
datagram, like vmnet-helper on macOS. When the interface is ready it prints one
JSON line on stdout; it logs to stderr and stops on SIGTERM or SIGINT, deleting
the TAP. Run it as root: it drops to --uid/--gid (default $SUDO_UID/$SUDO_GID)
before it touches the VM's socket.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runHelper(cmd, g, s, f)
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&f.fd, "fd", -1, "inherited connected unix datagram socket (one end of a socketpair)")
	fl.StringVar(&f.socket, "socket", "", "create this unix datagram socket and serve the first client that sends to it")
	fl.StringVar(&f.network, "network", "", "vmnetctl network to join (as `vmnetctl networks` lists it)")
	fl.StringVar(&f.mode.OperationMode, "operation-mode", "", "without --network: join the shared, host or bridged network of networks.yaml (default shared)")
	fl.StringVar(&f.mode.SharedInterface, "shared-interface", "", "host interface of the bridged network (--operation-mode bridged)")
	fl.StringVar(&f.mode.StartAddress, "start-address", "", "gateway address; with --end-address and --subnet-mask, must match the network")
	fl.StringVar(&f.mode.EndAddress, "end-address", "", "end of the DHCP range; must match the network")
	fl.StringVar(&f.mode.SubnetMask, "subnet-mask", "", "subnet mask; must match the network")
	fl.StringVar(&f.interfaceID, "interface-id", "", "UUID of the interface: the same id gives the same MAC address (default: random)")
	fl.BoolVar(&f.isolation, "enable-isolation", false, "isolate the VM from the network's other isolated VMs")
	fl.BoolVar(&f.tso, "enable-tso", false, "TCP segmentation offload: datagrams start with a virtio-net header and carry up to 65550 bytes")
	fl.BoolVar(&f.csum, "enable-checksum-offload", false, "checksum offload: datagrams start with a virtio-net header")
	fl.Float64Var(&f.statsInterval, "stats-interval", 0, "log stats every SECONDS (default: only when stopping)")
	fl.BoolVarP(&f.verbose, "verbose", "v", false, "log DEBUG lines")
	fl.BoolVar(&f.version, "version", false, "print the version and exit")
	fl.BoolVar(&f.listSharedInterfaces, "list-shared-interfaces", false, "list the host interfaces a bridged network could use and exit")
	fl.IntVar(&f.uid, "uid", envID("SUDO_UID"), "run as this user after creating the TAP, and make it the TAP's owner (default $SUDO_UID, else unchanged)")
	fl.IntVar(&f.gid, "gid", envID("SUDO_GID"), "run as this group (default $SUDO_GID, else the user's primary group)")
	fl.StringVar(&f.tap, "tap", "", "name of the TAP (default vmt- and a hash of the interface id)")
	fl.StringVar(&f.deleteLink, helper.DeleteLinkFlag, "", "internal: delete this link when stdin closes")
	fl.MarkHidden(helper.DeleteLinkFlag)
	fl.StringVar(&f.attach, "attach", "", "tap: create a persistent TAP for the VMM to open (firecracker, cloud-hypervisor, qemu -netdev tap) and relay nothing")
	return cmd
}

// envID is a numeric id from the environment, or -1.
func envID(name string) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v >= 0 {
		return v
	}
	return -1
}

func runHelper(cmd *cobra.Command, g *globals, s streams, f *helperFlags) error {
	if f.deleteLink != "" {
		return helper.DeleteLinkOnEOF(f.deleteLink, s.in)
	}
	if f.version {
		fmt.Fprintf(s.out, "version: %s\ncommit: %s\n", version, commit())
		return nil
	}
	if f.listSharedInterfaces {
		names, err := helper.ListSharedInterfaces()
		if err != nil {
			return err
		}
		for _, n := range names {
			fmt.Fprintln(s.out, n)
		}
		return nil
	}
	if f.statsInterval < 0 {
		return fmt.Errorf("--stats-interval %v must not be negative", f.statsInterval)
	}
	if f.interfaceID != "" {
		if err := api.CheckInterfaceID(f.interfaceID); err != nil {
			return err
		}
	}
	if runtime.GOOS != "linux" {
		return helper.Run(cmd.Context(), helper.Options{})
	}
	nets, diags, err := config.LoadNetworks(g.networks)
	printWarnings(s.err, diags)
	if err != nil {
		return err
	}
	n, err := helper.ResolveNetwork(nets, f.network, f.mode)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return helper.Run(ctx, helper.Options{
		FD:              f.fd,
		SocketPath:      f.socket,
		Network:         n,
		NetworkFlag:     f.network != "",
		InterfaceID:     f.interfaceID,
		TapName:         f.tap,
		Attach:          f.attach,
		Isolation:       f.isolation || n.Isolation,
		TSO:             f.tso,
		ChecksumOffload: f.csum,
		StatsInterval:   time.Duration(f.statsInterval * float64(time.Second)),
		UID:             f.uid,
		GID:             f.gid,
		Verbose:         f.verbose,
		Stdout:          s.out,
		Stderr:          s.err,
	})
}
