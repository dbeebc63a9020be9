package vmnethelper

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/backend"
)

// Backend is macOS's: vmnet is the data plane, and each
// attachment's helper is vmnet-helper. vmnet creates a network when the
// first helper joins it and removes it when the last leaves, so there is
// nothing to start or remove per network; its DHCP server (bootpd) keeps
// its leases in /var/db/dhcpd_leases. It is plain Go, so it is tested on
// Linux with a fake vmnet-helper.
type Backend struct {
	// Path is vmnet-helper; empty looks it up (Find)
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

// ErrStreamNeedsLinux is returned for `attach: stream` attachments on
// macOS: vmnet-helper serves datagram sockets only (its issue 291); lima
// there uses its own vmnet networks.
var ErrStreamNeedsLinux = errors.New("attach: stream needs Linux (vmnet-helper serves datagram sockets only); use a socket attachment")

// ErrVhostUserNeedsLinux: vhost-user is the Linux helper's; vmnet-helper
// and macOS's VMMs (vfkit, krunkit) use datagram sockets.
var ErrVhostUserNeedsLinux = errors.New("attach: vhost-user needs Linux (vmnet-helper serves datagram sockets only); use a socket attachment")

// Name is the backend's name for --backend.
const Name = "vmnet-helper"

func (Backend) Name() string { return Name }

func (b Backend) StartNetwork(_ context.Context, n *api.Network, _ backend.NetworkOptions) (backend.Network, error) {
	if err := CheckNetwork(n); err != nil {
		return nil, err
	}
	return &vmnetNetwork{n: n, leasesFile: b.leasesFile()}, nil
}

func (b Backend) leasesFile() string {
	if b.LeasesFile != "" {
		return b.LeasesFile
	}
	return "/var/db/dhcpd_leases"
}

func (Backend) RemoveNetwork(context.Context, string, backend.NetworkOptions) error { return nil }

func (Backend) Sweep(context.Context, []string, backend.NetworkOptions) ([]string, error) {
	return nil, nil
}

func (Backend) CheckNetwork(_ context.Context, n *api.Network, _ backend.NetworkOptions) error {
	return CheckNetwork(n)
}

// Limits lists what vmnet-helper would refuse to run and what of
// networks.yaml it cannot honour, as "network NAME (vmnet-helper): ..." and
// "VM/INDEX (vmnet-helper): ..." lines.
func (b Backend) Limits(nets []*api.Network, atts []*api.Attachment) []backend.Limit {
	var out []backend.Limit
	for _, n := range nets {
		if !n.Managed() {
			continue
		}
		if err := CheckNetwork(n); err != nil {
			out = append(out, backend.Limit{Message: fmt.Sprintf("network %s (%s): will not start: %v", n.ID, b.Name(), err), Refused: true})
		}
		for _, w := range NetworkWarnings(n) {
			out = append(out, backend.Limit{Message: fmt.Sprintf("network %s (%s): %s", n.ID, b.Name(), w)})
		}
		if n.Socket {
			out = append(out, backend.Limit{Message: fmt.Sprintf("network %s (%s): will not start: socket: %v", n.ID, b.Name(), ErrStreamNeedsLinux), Refused: true})
		}
	}
	for _, a := range atts {
		switch {
		case a.Attach == api.AttachTAP:
			out = append(out, backend.Limit{Message: fmt.Sprintf("%s (%s): will not start: %v", a.Key(), b.Name(), ErrTapNeedsLinux), Refused: true})
		case a.Attach == api.AttachStream:
			out = append(out, backend.Limit{Message: fmt.Sprintf("%s (%s): will not start: %v", a.Key(), b.Name(), ErrStreamNeedsLinux), Refused: true})
		case a.Attach == api.AttachVhostUser:
			out = append(out, backend.Limit{Message: fmt.Sprintf("%s (%s): will not start: %v", a.Key(), b.Name(), ErrVhostUserNeedsLinux), Refused: true})
		case a.IP.IsValid():
			out = append(out, backend.Limit{Message: fmt.Sprintf("%s (%s): ip: %s cannot be honoured on macOS: vmnet's DHCP server takes no reservations from vmnetctl", a.Key(), b.Name(), a.IP)})
		}
		if a.Egress != nil {
			out = append(out, backend.Limit{Message: fmt.Sprintf("%s (%s): egress cannot be honoured on macOS: vmnet has no egress filtering", a.Key(), b.Name())})
		}
		if a.Bandwidth != nil {
			out = append(out, backend.Limit{Message: fmt.Sprintf("%s (%s): bandwidth cannot be honoured on macOS: vmnet has no limits per port", a.Key(), b.Name())})
		}
		if a.Impair != nil {
			out = append(out, backend.Limit{Message: fmt.Sprintf("%s (%s): impair cannot be honoured on macOS: vmnet loses, delays, duplicates and reorders no frames on purpose, and vmnet-helper shapes none", a.Key(), b.Name())})
		}
		if len(a.PortForwards) > 0 {
			out = append(out, backend.Limit{Message: fmt.Sprintf("%s (%s): portForwards cannot be honoured on macOS: vmnet has no port forwards (lima's own forwarding, over ssh, does it there)", a.Key(), b.Name())})
		}
	}
	return out
}

// Cleanup has nothing to do: vmnet removes a helper's interface with it.
func (Backend) Cleanup(*api.Attachment) error { return nil }

// EnsurePorts has nothing to do: vmnet owns the VMs' ports.
func (Backend) EnsurePorts(context.Context, *api.Network, []backend.Port) error { return nil }

// ClaimPorts has nothing to do: vmnet gives each VM its MAC.
func (Backend) ClaimPorts(context.Context, *api.Network, []*api.Attachment, backend.ClaimOptions) error {
	return nil
}

// CheckRootOwned checks, after symbolic links, that only root can change
// the vmnet-helper at path (CheckOwner): it runs as root through sudo.
func CheckRootOwned(path string) error {
	resolved, err := filepath.EvalSymlinks(path)
	if err != nil {
		return err
	}
	return CheckOwner(resolved, os.Stat, fileUID)
}

// HelperEnv gives vmnet-helper the VM's owner the way it reads it: it drops
// its privileges to $SUDO_UID and $SUDO_GID.
func (Backend) HelperEnv(s backend.HelperSpec) []string {
	if s.UID < 0 {
		return nil
	}
	return []string{"SUDO_UID=" + strconv.Itoa(s.UID), "SUDO_GID=" + strconv.Itoa(s.GID)}
}

func (b Backend) HelperCommand(s backend.HelperSpec) ([]string, error) {
	a := s.Attachment
	if a.Attach == api.AttachTAP {
		return nil, ErrTapNeedsLinux
	}
	if a.Attach == api.AttachStream {
		return nil, ErrStreamNeedsLinux
	}
	if a.Attach == api.AttachVhostUser {
		return nil, ErrVhostUserNeedsLinux
	}
	path := b.Path
	if path == "" {
		var err error
		if path, err = Find(s.VMNetHelperPath, os.Stat); err != nil {
			return nil, err
		}
	}
	if b.Sudo {
		// Run as root only a vmnet-helper that only root can change.
		if err := CheckRootOwned(path); err != nil {
			return nil, err
		}
	}
	o := Options{
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
		o.Isolation = s.Network.Isolation
	}
	return Command(o)
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
func (v *vmnetNetwork) SetVMs([]string, []net.HardwareAddr)                {}
func (v *vmnetNetwork) ChangeVMs([]string, []string, []net.HardwareAddr)   {}

// SetVMEgress does nothing: vmnet has no egress filtering (validate says so).
func (v *vmnetNetwork) SetVMEgress(context.Context, []backend.VMEgress) error { return nil }

// SetForwards does nothing: vmnet has no port forwards (validate says so).
func (v *vmnetNetwork) SetForwards(context.Context, []backend.Forward) error { return nil }

// Leases are bootpd's unexpired leases in the network's subnet, one per MAC.
func (v *vmnetNetwork) Leases() []backend.Lease {
	ls, _ := bootpdLeases(v.leasesFile, v.n)
	return ls
}

// StoredLeases are bootpd's unexpired leases in n's subnet: vmnet's DHCP
// server keeps them, whatever the lease dir says.
func (b Backend) StoredLeases(n *api.Network, _ backend.NetworkOptions) ([]backend.Lease, error) {
	return bootpdLeases(b.leasesFile(), n)
}

// bootpdLeases reads bootpd's lease file at path: its unexpired leases in
// n's subnet, one per MAC; none without the file.
func bootpdLeases(path string, n *api.Network) ([]backend.Lease, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	all, _ := ParseDHCPDLeases(data) // the good blocks even if some are not
	var out []backend.Lease
	for _, l := range CurrentLeases(all, n.Subnet, time.Now()) {
		mac := ""
		if l.MAC != nil {
			mac = l.MAC.String()
		}
		out = append(out, backend.Lease{MAC: mac, IP: l.IP, Hostname: l.Name, Expiry: l.Expires})
	}
	return out, nil
}

func (v *vmnetNetwork) Stats(backend.StatsQuery) backend.ServiceStats { return backend.ServiceStats{} }

// Health: vmnet runs the services, and tells nothing of them.
func (v *vmnetNetwork) Health() error { return nil }

func (v *vmnetNetwork) Close() error { return nil }
