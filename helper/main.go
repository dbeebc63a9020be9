package helper

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	gosignal "os/signal"
	"runtime"
	"slices"
	"syscall"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/config"
	"github.com/vmnetctl/vmnetctl/helperexec"
	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/netplane"
)

// errNotLinux: elsewhere vmnetctl runs vmnet-helper itself.
var errNotLinux = errors.New("`vmnetctl helper` runs on Linux only; on macOS vmnetctl uses vmnet-helper")

// holds says whether the helper holds its network up for as long as it
// runs (Flags.EnsureNetwork): one started on its own, as root, on a
// shared or host network, whether the network is up yet or not (another
// helper that brought it up may exit first).
func (f *Flags) holds(n *api.Network) bool {
	if f.EnsureNetwork == nil || os.Geteuid() != 0 || os.Getenv(helperproto.EnvUnderController) != "" || !n.Routed() {
		return false
	}
	if n.OnDemand != nil {
		return true
	}
	_, err := netplane.NetworkBridge(n)
	return err == nil || netplane.IsNotUp(err)
}

// Binary is the helper's own program, cmd/vmnetctl-helper, installed next
// to vmnetctl: `vmnetctl helper` without the rest of vmnetctl (Program).
const Binary = "vmnetctl-helper"

// DeleteLinkFlag is the hidden `vmnetctl helper` flag of the child that
// deletes a VM port outliving the helper (netplane.DeleteLinkOnEOF).
const DeleteLinkFlag = "delete-link-on-eof"

// Flags are `vmnetctl helper`'s command line: vmnet-helper's flags, plus
// --uid, --gid, --tap and --attach (docs/helper.md).
type Flags struct {
	FD                   int    // --fd, -1 for none
	Socket               string // --socket
	Network              string // --network
	Mode                 ModeFlags
	InterfaceID          string
	Isolation            bool
	TSO, ChecksumOffload bool
	StatsInterval        float64 // seconds
	Verbose              bool
	LogTimestamps        bool   // --log-timestamps
	StatsFile            string // --stats-file
	ShapingFile          string // --shaping-file
	PrintVersion         bool   // --version
	ListSharedInterfaces bool
	UID, GID             int
	Tap                  string
	Attach               string
	MAC                  string // --mac: the only MAC the VM may send from
	NoSpoofCheck         bool   // --no-spoof-check
	DeleteLink           string // the hidden DeleteLinkFlag
	Relearn              bool   // the hidden RelearnFlag
	NoRelayOffloads      bool   // the hidden NoRelayOffloadsFlag

	// NetworksFile is networks.yaml as config.LoadNetworks finds it (the
	// global --networks flag; empty for the default).
	NetworksFile string
	// StateDir is --state-dir (through sudo, only the default).
	StateDir string
	// EnsureNetwork, if set, brings up a network of networks.yaml that is
	// not up, for as long as the helper runs (the controller's
	// HoldNetwork): as vmnet does, a helper started cold just works.
	EnsureNetwork func(ctx context.Context, n *api.Network) error
	// MadeOnDemand, if set, finds a network made on demand by its id, for
	// a --network that networks.yaml does not define (the state dir's
	// statedir.Dir.NetworkMadeOnDemand); nil, nil if there is none.
	MadeOnDemand func(id string) (*api.Network, error)
	// Version and Commit are what --version prints.
	Version, Commit string
}

// Streams are the command's standard I/O.
type Streams struct {
	In       io.Reader
	Out, Err io.Writer
}

// Main is `vmnetctl helper`: it answers --version and
// --list-shared-interfaces, or resolves the network of networks.yaml that
// the flags name and runs the helper until SIGTERM or SIGINT (Run).
func Main(ctx context.Context, f Flags, s Streams) error {
	switch {
	case f.DeleteLink != "" && throughSudo():
		// The helper starts its cleanup child without sudo's variables:
		// one run through sudo is someone's who would delete a port that
		// is not theirs (a sudo helper's TAP carries no owner to tell).
		return fmt.Errorf("--%s is the helper's own cleanup child, not to be run through sudo", DeleteLinkFlag)
	case f.DeleteLink != "":
		return netplane.DeleteLinkOnEOF(f.DeleteLink, s.In)
	case f.Relearn && (throughSudo() || os.Geteuid() != 0):
		return fmt.Errorf("--%s is for the relay of a helper that runs as root, not through sudo", RelearnFlag)
	case f.PrintVersion:
		_, err := fmt.Fprintf(s.Out, "version: %s\ncommit: %s\n", f.Version, f.Commit)
		return err
	case f.ListSharedInterfaces:
		return listSharedInterfaces(s.Out)
	}
	if err := f.check(); err != nil {
		return err
	}
	if err := f.checkSudo(); err != nil {
		return err
	}
	if runtime.GOOS != "linux" {
		return errNotLinux
	}
	o, err := f.options(s)
	if err != nil {
		return err
	}
	if f.Relearn {
		return relearnMAC(ctx, o)
	}
	if f.holds(o.Network) {
		if err := f.EnsureNetwork(ctx, o.Network); err != nil {
			return fmt.Errorf("network %q is not up, and bringing it up failed: %w", o.Network.ID, err)
		}
	}
	ctx, stop := gosignal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return Run(ctx, o)
}

func listSharedInterfaces(w io.Writer) error {
	if runtime.GOOS != "linux" {
		return errNotLinux
	}
	names, err := netplane.ListSharedInterfaces()
	if err != nil {
		return err
	}
	for _, n := range names {
		fmt.Fprintln(w, n)
	}
	return nil
}

// check reports flag values that are wrong on their own; Options.check
// reports those that do not go together.
func (f *Flags) check() error {
	if f.StatsInterval < 0 {
		return fmt.Errorf("--stats-interval %v must not be negative", f.StatsInterval)
	}
	if f.MAC != "" {
		if _, err := net.ParseMAC(f.MAC); err != nil {
			return fmt.Errorf("--mac %q: %w", f.MAC, err)
		}
	}
	if f.InterfaceID != "" {
		return api.CheckInterfaceID(f.InterfaceID)
	}
	return nil
}

// options loads networks.yaml, resolves the network to join and returns
// the helper's Options.
func (f *Flags) options(s Streams) (Options, error) {
	nets, diags, err := config.LoadNetworks(f.NetworksFile)
	for _, d := range diags.Warnings().Sorted() {
		fmt.Fprintln(s.Err, d)
	}
	if err != nil {
		return Options{}, err
	}
	if f.Network != "" && nets.Get(f.Network) == nil && f.MadeOnDemand != nil {
		od, err := f.MadeOnDemand(f.Network)
		if err != nil {
			return Options{}, err
		}
		if od != nil {
			withOD := *nets
			withOD.Networks = append(slices.Clone(nets.Networks), od)
			nets = &withOD
		}
	}
	n, err := ResolveNetwork(nets, f.Network, f.Mode)
	if err != nil {
		return Options{}, err
	}
	return f.optionsFor(n, s), nil
}

// optionsFor is the helper's Options on network n, resolved.
func (f *Flags) optionsFor(n *api.Network, s Streams) Options {
	var vmMAC net.HardwareAddr
	if f.MAC != "" {
		vmMAC, _ = net.ParseMAC(f.MAC) // checked
	}
	return Options{
		FD:              f.FD,
		SocketPath:      f.Socket,
		Network:         n,
		NetworkFlag:     f.Network != "",
		InterfaceID:     f.InterfaceID,
		TapName:         f.Tap,
		Attach:          f.Attach,
		VMMAC:           vmMAC,
		NoSpoofCheck:    f.NoSpoofCheck,
		NoRelayOffloads: f.NoRelayOffloads,
		Isolation:       f.Isolation || n.Isolation,
		TSO:             f.TSO,
		ChecksumOffload: f.ChecksumOffload,
		StatsInterval:   time.Duration(f.StatsInterval * float64(time.Second)),
		UID:             f.UID,
		GID:             f.GID,
		Verbose:         f.Verbose,
		LogTimestamps:   f.LogTimestamps,
		StatsFile:       f.StatsFile,
		ShapingFile:     f.ShapingFile,
		Stdout:          s.Out,
		Stderr:          s.Err,
	}
}

// RelearnFlag is helperexec.RelearnFlag, the hidden flag of the command
// vmnetctl-relay runs to make a learning port's guard forget its MAC.
const RelearnFlag = helperexec.RelearnFlag

// NoRelayOffloadsFlag turns off the offloads the relay does for a VM
// without them (netplane.Offloads.Relayed), for the benchmark to measure
// what they buy.
const NoRelayOffloadsFlag = "no-relay-offloads"
