package controller

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/helperexec"
	"github.com/vmnetctl/vmnetctl/netplane"
)

// VMNetHelperBackend is macOS's: vmnet is the data plane, and each
// attachment's helper is vmnet-helper. vmnet creates a network when the
// first helper joins it and removes it when the last leaves, so there is
// nothing to start or remove per network; its DHCP server (bootpd) keeps
// its leases in /var/db/dhcpd_leases. It is plain Go, so it is tested on
// Linux with a fake vmnet-helper.
type VMNetHelperBackend struct {
	// Path is vmnet-helper; empty looks it up (helperexec.FindVMNetHelper)
	// from paths.vmnetHelper in networks.yaml, then the usual places.
	Path string
	// Sudo runs vmnet-helper through `sudo --non-interactive`, for a
	// controller that is not root.
	Sudo bool
	// LeasesFile is bootpd's lease file (default /var/db/dhcpd_leases).
	LeasesFile string
}

// ErrTapNeedsLinux is returned for `attach: tap` attachments on macOS.
var ErrTapNeedsLinux = errors.New("attach: tap needs Linux (vmnet has no TAP devices); use a socket attachment")

func (b VMNetHelperBackend) Name() string { return "vmnet-helper" }

func (b VMNetHelperBackend) StartNetwork(_ context.Context, n *api.Network, _ string, _ []string, _ *slog.Logger) (NetworkRuntime, error) {
	if err := helperexec.CheckVMNetHelperNetwork(n); err != nil {
		return nil, err
	}
	return &vmnetNetwork{n: n, leasesFile: b.leasesFile()}, nil
}

func (b VMNetHelperBackend) leasesFile() string {
	if b.LeasesFile != "" {
		return b.LeasesFile
	}
	return "/var/db/dhcpd_leases"
}

func (VMNetHelperBackend) RemoveNetwork(context.Context, string, string) error { return nil }

func (VMNetHelperBackend) Sweep(context.Context, string) ([]string, error) { return nil, nil }

func (VMNetHelperBackend) CheckNetwork(_ context.Context, n *api.Network) error {
	return helperexec.CheckVMNetHelperNetwork(n)
}

func (VMNetHelperBackend) Warnings(n *api.Network) []string { return helperexec.VMNetHelperWarnings(n) }

// Cleanup has nothing to do: vmnet removes a helper's interface with it.
func (VMNetHelperBackend) Cleanup(*Attachment) error { return nil }

func (b VMNetHelperBackend) HelperCommand(s HelperSpec) ([]string, error) {
	a := s.Attachment
	if a.Attach == api.AttachTAP {
		return nil, ErrTapNeedsLinux
	}
	path := b.Path
	if path == "" {
		var err error
		if path, err = helperexec.FindVMNetHelper(s.VMNetHelperPath, os.Stat); err != nil {
			return nil, err
		}
	}
	if b.Sudo {
		// Run as root only a vmnet-helper that only root can change.
		resolved, err := filepath.EvalSymlinks(path)
		if err != nil {
			return nil, err
		}
		if err := helperexec.CheckVMNetHelperOwner(resolved, os.Stat, fileUID); err != nil {
			return nil, err
		}
	}
	o := helperexec.VMNetHelperOptions{
		Path: path, Socket: s.Socket, FD: s.FD,
		InterfaceID:     api.InterfaceID(a.VM, a.Index, a.MAC),
		Network:         s.Network,
		TSO:             s.Network.Offloads,
		ChecksumOffload: s.Network.Offloads,
		StatsInterval:   s.StatsInterval,
		Sudo:            b.Sudo,
	}
	if s.Network.VMNetBroker != "" {
		o.Network, o.BrokerNetwork = nil, s.Network.VMNetBroker
	}
	return helperexec.VMNetHelperCommand(o)
}

// vmnetNetwork is a network vmnet runs; vmnetctl only reads its leases.
type vmnetNetwork struct {
	n          *api.Network
	leasesFile string
}

func (v *vmnetNetwork) Config() *api.Network { return v.n }

// SetHost has nothing to do: vmnet serves neither reservations nor names
// (validate and plan warn about both).
func (v *vmnetNetwork) SetHost(net.HardwareAddr, string, netip.Addr) error { return nil }

// Leases are bootpd's unexpired leases in the network's subnet, one per MAC.
func (v *vmnetNetwork) Leases() []netplane.Lease {
	data, err := os.ReadFile(v.leasesFile)
	if err != nil {
		return nil
	}
	all, _ := helperexec.ParseDHCPDLeases(data) // the good blocks even if some are not
	var out []netplane.Lease
	for _, l := range helperexec.CurrentLeases(all, v.n.Subnet, time.Now()) {
		mac := ""
		if l.MAC != nil {
			mac = l.MAC.String()
		}
		out = append(out, netplane.Lease{MAC: mac, IP: l.IP, Hostname: l.Name, Expiry: l.Expires})
	}
	return out
}

func (v *vmnetNetwork) Stats() netplane.Stats { return netplane.Stats{} }

func (v *vmnetNetwork) Close() error { return nil }
