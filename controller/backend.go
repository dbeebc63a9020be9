package controller

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/netplane"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// Backend is what differs between platforms: who provides a network, and
// which helper connects a VM to it. On Linux vmnetctl is the data plane
// (netplane) and its own `vmnetctl helper` the helper; on macOS vmnet is the
// data plane and vmnet-helper the helper. The controller is the same.
type Backend interface {
	// Name is how docs, logs and errors call the backend.
	Name() string
	// StartNetwork brings a network up (idempotently) with its services.
	StartNetwork(ctx context.Context, n *api.Network, leaseDir string, upstreams []string, log *slog.Logger) (NetworkRuntime, error)
	// RemoveNetwork removes what StartNetwork made; twice is fine.
	RemoveNetwork(ctx context.Context, id, leaseDir string) error
	// Sweep removes every network of this backend's that runs, when none should.
	Sweep(ctx context.Context, leaseDir string) ([]string, error)
	// CheckNetwork tells whether the network runs as configured.
	CheckNetwork(ctx context.Context, n *api.Network) error
	// HelperCommand is the command line of the helper for one attachment.
	HelperCommand(s HelperSpec) ([]string, error)
	// Warnings lists the settings of n this backend cannot honour.
	Warnings(n *api.Network) []string
	// Cleanup removes what a killed helper of a may have left behind.
	Cleanup(a *Attachment) error
}

// HelperSpec is what a backend needs to build a helper's command line.
type HelperSpec struct {
	// Executable is vmnetctl itself (for `vmnetctl helper`).
	Executable string
	Attachment *Attachment
	Network    *api.Network
	Owner      *statedir.Project
	// Socket is the path of the socket to serve, or "".
	Socket string
	// FD is the inherited socket's descriptor in the helper, or -1.
	FD int
	// NetworksFile is the networks.yaml in force; VMNetHelperPath its
	// paths.vmnetHelper.
	NetworksFile    string
	VMNetHelperPath string
	StatsInterval   time.Duration
}

// NetworkRuntime is a network that runs.
type NetworkRuntime interface {
	Config() *api.Network
	SetHost(mac net.HardwareAddr, name string, ip netip.Addr) error
	Leases() []netplane.Lease
	Stats() netplane.Stats
	Close() error
}

// linuxBackend is vmnetctl's own data plane and helper.
type linuxBackend struct{}

func (linuxBackend) Name() string { return "vmnetctl" }

func (linuxBackend) StartNetwork(ctx context.Context, n *api.Network, leaseDir string, upstreams []string, log *slog.Logger) (NetworkRuntime, error) {
	nw, err := netplane.Start(ctx, n, netplane.Options{StateDir: leaseDir, Upstreams: upstreams, Log: log})
	if err != nil {
		return nil, err
	}
	return nw, nil
}

func (linuxBackend) RemoveNetwork(ctx context.Context, id, leaseDir string) error {
	return netplane.Remove(ctx, id, leaseDir)
}

func (linuxBackend) Sweep(ctx context.Context, leaseDir string) ([]string, error) {
	return netplane.Sweep(ctx, nil, leaseDir)
}

func (linuxBackend) CheckNetwork(ctx context.Context, n *api.Network) error {
	return netplane.Check(ctx, n)
}

func (linuxBackend) Warnings(*api.Network) []string { return nil }

// Cleanup removes the TAP of a helper that was killed with its cleanup
// child (only if it carries the helper's mark).
func (linuxBackend) Cleanup(a *Attachment) error {
	return netplane.RemoveStaleTap(api.TapName(api.InterfaceID(a.VM, a.Index, a.MAC)))
}

func (linuxBackend) HelperCommand(s HelperSpec) ([]string, error) {
	a, n := s.Attachment, s.Network
	args := []string{s.Executable, "helper", "--networks", s.NetworksFile, "--network", n.ID,
		"--interface-id", api.InterfaceID(a.VM, a.Index, a.MAC), "--stats-interval", strconv.FormatFloat(s.StatsInterval.Seconds(), 'f', -1, 64)}
	if s.Owner.UID >= 0 {
		args = append(args, "--uid", strconv.Itoa(s.Owner.UID), "--gid", strconv.Itoa(s.Owner.GID))
	}
	if n.Isolation {
		args = append(args, "--enable-isolation")
	}
	if n.Offloads {
		args = append(args, "--enable-tso", "--enable-checksum-offload")
	}
	switch {
	case s.FD >= 0:
		args = append(args, "--fd", strconv.Itoa(s.FD))
	case a.Attach == api.AttachTAP:
		args = append(args, "--attach", "tap")
	default:
		args = append(args, "--socket", s.Socket)
	}
	return args, nil
}

// Backends are the backends by name, for --backend.
var Backends = map[string]Backend{
	"vmnetctl":     linuxBackend{},
	"vmnet-helper": VMNetHelperBackend{},
}

// BackendWarnings lists, as "network NAME: ..." and "VM/INDEX: ..." lines,
// what the backend cannot honour of the managed networks and attachments
// given: its warnings, and what it would refuse to run at all.
func BackendWarnings(b Backend, nets []*api.Network, atts []*api.Attachment) []string {
	var out []string
	for _, n := range nets {
		if !n.Managed() {
			continue
		}
		if err := b.CheckNetwork(context.Background(), n); err != nil && b.Name() != "vmnetctl" {
			out = append(out, fmt.Sprintf("network %s (%s): will not start: %v", n.ID, b.Name(), err))
		}
		for _, w := range b.Warnings(n) {
			out = append(out, fmt.Sprintf("network %s (%s): %s", n.ID, b.Name(), w))
		}
	}
	if _, ok := b.(VMNetHelperBackend); ok {
		for _, a := range atts {
			switch {
			case a.Attach == api.AttachTAP:
				out = append(out, fmt.Sprintf("%s (%s): will not start: %v", a.Key(), b.Name(), ErrTapNeedsLinux))
			case a.IP.IsValid():
				out = append(out, fmt.Sprintf("%s (%s): ip: %s cannot be honoured on macOS: vmnet's DHCP server takes no reservations from vmnetctl", a.Key(), b.Name(), a.IP))
			}
		}
	}
	return out
}
