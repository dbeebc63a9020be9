// Package backend is what differs between platforms, behind one neutral
// interface: who provides a network, and which helper connects a VM to it.
// On Linux (package linuxnet) vmnetctl is the data plane (netplane) and its
// own `vmnetctl helper` the helper; on macOS (package vmnethelper) vmnet is
// the data plane and vmnet-helper the helper. The controller is the same for
// both, and sees only the types of this package.
package backend

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/leases"
	"github.com/vmnetctl/vmnetctl/nettypes"
)

// Backend provides networks and builds the helpers' command lines.
type Backend interface {
	// Name is how docs, logs and errors call the backend.
	Name() string
	// StartNetwork brings a network up (idempotently) with its services.
	StartNetwork(ctx context.Context, n *api.Network, o NetworkOptions) (Network, error)
	// RemoveNetwork removes what StartNetwork made; twice is fine.
	RemoveNetwork(ctx context.Context, id string, o NetworkOptions) error
	// Sweep removes every network of this backend's (and this owner's)
	// that runs but keep does not list: all of them when keep is empty.
	// It returns the networks it removed.
	Sweep(ctx context.Context, keep []string, o NetworkOptions) ([]string, error)
	// CheckNetwork tells whether the network runs as configured.
	CheckNetwork(ctx context.Context, n *api.Network, o NetworkOptions) error
	// EnsurePorts puts back what was taken from a running network's VM
	// ports behind their helpers' backs (a port off its bridge, a guard
	// gone), after the network was repaired.
	EnsurePorts(ctx context.Context, n *api.Network, ports []Port) error
	// ClaimPorts reserves, on network n, each attachment's MAC (derived
	// or pinned) for its port, before the helpers start: no other VM's
	// port may send from it. atts are all of n's attachments; a port
	// of one no longer there loses its claim. o says what is read first
	// (nettypes.ClaimOptions).
	ClaimPorts(ctx context.Context, n *api.Network, atts []*api.Attachment, o ClaimOptions) error
	// HelperCommand is the command line of the helper for one attachment.
	HelperCommand(s HelperSpec) ([]string, error)
	// HelperEnv is what the helper's environment adds to the controller's,
	// from which the controller removes sudo's SUDO_* variables.
	HelperEnv(s HelperSpec) []string
	// StoredLeases are network n's unexpired leases as its DHCP server
	// keeps them on disk (vmnetctl's lease files under o.LeaseDir, or
	// bootpd's), readable whether or not the network runs.
	StoredLeases(n *api.Network, o NetworkOptions) ([]Lease, error)
	// Limits lists, one sentence each, what the backend cannot honour of
	// these networks and attachments, or would refuse to run.
	Limits(nets []*api.Network, atts []*api.Attachment) []Limit
	// Cleanup removes what a killed helper of a may have left behind.
	Cleanup(a *api.Attachment) error
}

// HelperProgrammer is a backend whose helper command line is run by
// another program than the one its first word names (Linux:
// vmnetctl-helper runs `vmnetctl helper`, helper.Program). The process
// still shows that command line, by which the controller knows it.
type HelperProgrammer interface {
	HelperProgram(argv0 string) string
}

// HelperPreparer is a backend that may set a helper up in the calling
// process (the controller's) and start only its relay (Linux:
// helper.Prepare): one process start an attachment instead of two.
type HelperPreparer interface {
	// PrepareHelper sets up the helper whose command line is argv (from
	// HelperCommand), or returns nil, nil for one it does not (the caller
	// runs argv).
	PrepareHelper(argv []string, s HelperSpec) (*PreparedHelper, error)
}

// PreparedHelper is a helper set up in the calling process: the command
// that runs the rest of it, under the helper's command line.
type PreparedHelper struct {
	// Cmd runs the helper's relay; its Env holds what the relay needs
	// (the caller adds its own).
	Cmd *exec.Cmd
	// Log is what the helper logged while it was set up, for its log.
	Log []byte
	// Release closes the caller's copies of what the relay inherits, once
	// Cmd started or failed to; a second call does nothing.
	Release func()
	// AfterExit, if set, is called once Cmd's process has exited, or
	// failed to start (helperexec.StartOptions.AfterExit): it closes what
	// the caller kept after Release, the VM's port, which goes then.
	AfterExit func()
}

// Partitioner is a running network that parts its VMs (Linux): no frame
// passes between the two VMs of a pair (their MACs, each way).
type Partitioner interface {
	SetPartitions(pairs [][2]net.HardwareAddr) error
}

// Impairer is a running network that impairs its VMs' ports on purpose
// (Linux): each port in ps loses its share of frames, the others none.
type Impairer interface {
	SetImpairments(ps []PortImpairment) error
}

// Capturer is a backend that captures a VM port's frames (Linux).
type Capturer interface {
	// Capture copies port's frames to w as pcapng until o says it ends
	// or ctx is done (package capture), calling o.Bound (if set) once it
	// hears them, before it writes anything.
	Capture(ctx context.Context, port string, o CaptureOptions, w io.Writer) (CaptureStats, error)
}

// Shaper is a backend that limits an attachment's bandwidth in the
// kernel (Linux); the controller sets each running helper's port's.
type Shaper interface {
	// SetBandwidth makes port's limits b (nil: none), putting back what
	// changed behind vmnetctl's back and changing nothing that is so.
	SetBandwidth(ctx context.Context, port string, b *api.Bandwidth) error
}

// Limit is one thing a backend cannot do of a configuration.
type Limit struct {
	Message string
	// Refused: the backend would not start it (an error, not a warning).
	Refused bool
}

// Port is a running helper's VM port, as EnsurePorts needs it.
type Port struct {
	// Name is the port's (the helper's tap_name).
	Name string
	// MAC is the VM's pinned MAC; nil when the guard learns it.
	MAC        net.HardwareAddr
	SpoofCheck bool
}

// Watcher is a Backend that reports changes to its networks made behind
// its back (a bridge deleted), so the controller repairs them at once
// rather than at its next resync.
type Watcher interface {
	// Changes reports a change by a send, folding changes made while one
	// is pending into it, until ctx ends. notices, if not nil, counts
	// what the kernel said of the networks' VM ports (their links, the
	// guards' tables) and what it lost of that, ok false when it cannot
	// tell: while the count stands, the ports are as a full pass last
	// read them (netplane.Watch.Notices).
	Changes(ctx context.Context) (changes <-chan struct{}, notices func() (n uint64, ok bool), err error)
}

// LinkShaper is a Backend whose helpers shape their links (delay,
// jitter, duplicate, reorder: helperproto.Shapings) from the shaping file
// HelperSpec.ShapingFile names, and read it again on
// helperproto.ShapingSignal: Shapes says whether a's helper does.
type LinkShaper interface {
	Shapes(a *api.Attachment) bool
}

// TAPHandler is a Backend that can hand a VMM the descriptors of an
// `attach: tap` port (`vmnetctl run`): the VMM then moves the VM's frames
// through the TAP itself (with vhost-net, in the kernel), and no helper
// relays them.
type TAPHandler interface {
	// OpenTAP opens the port's TAP for a VMM.
	OpenTAP(name string) (*os.File, error)
	// Vhost reports whether the host has vhost-net for VMMs.
	Vhost() bool
	// OpenVhost opens vhost-net for a VMM; it fails when Vhost is false.
	OpenVhost() (*os.File, error)
}

// NetworkOptions are the host's settings for the networks of one state dir.
type NetworkOptions struct {
	// Owner is the state dir: the kernel objects it makes carry its
	// identity, so that two state dirs on one host keep apart.
	Owner string
	// LeaseDir keeps the DHCP servers' leases.
	LeaseDir string
	// Upstreams are the DNS proxies' resolvers (default: the host's).
	Upstreams []string
	Log       *slog.Logger
	// OnLease, if set, is told of each lease a network's DHCP server
	// grants (a new one, or a new address), and each one a client
	// releases or declines: kind is "lease-granted", "lease-released"
	// or "lease-declined".
	OnLease func(kind, network, mac string, ip netip.Addr)
	// OnEgressDenied, if set, is told of connections a network's VMs
	// opened that an egress policy refused: at most one a VM every 10 s,
	// with how many were left out (Linux).
	OnEgressDenied func(network string, f nettypes.DeniedFlow)
}

// HelperSpec is what a backend needs to build a helper's command line.
type HelperSpec struct {
	// Executable is vmnetctl itself (for `vmnetctl helper`).
	Executable string
	Attachment *api.Attachment
	Network    *api.Network
	// UID and GID own the helper's socket or TAP: the VM's user, or -1.
	UID, GID int
	// Socket is the path of the socket to serve, or "".
	Socket string
	// FD is the inherited socket's descriptor in the helper, or -1.
	FD int
	// NetworksFile is the networks.yaml in force; VMNetHelperPath its
	// paths.vmnetHelper.
	NetworksFile    string
	VMNetHelperPath string
	StatsInterval   time.Duration
	// StatsFile is where the helper keeps its latest stats line, for a
	// backend whose helper can (the Linux one); the controller reads it
	// before the helper's log.
	StatsFile string
	// ShapingFile is where the controller keeps the link's shaping
	// (helperproto.Shapings), for a helper whose relay shapes it (attach
	// socket or stream, on Linux); the backend passes it on to the
	// helpers that do.
	ShapingFile string
	// LogFile is the helper's log.
	LogFile string
	// Owner is the state dir that starts the helper, as NetworkOptions.Owner.
	Owner string
}

// Network is a network that runs.
type Network interface {
	Config() *api.Network
	// SetHost gives a VM's MAC its name (DNS) and fixed address (DHCP).
	SetHost(mac net.HardwareAddr, name string, ip netip.Addr) error
	// SetVMs ends a round of SetHost calls: names are every VM's of the
	// state dir, on any network (none is a DHCP client's name here), macs
	// this network's VMs' (SetHost's others have gone).
	SetVMs(names []string, macs []net.HardwareAddr)
	// ChangeVMs ends a round of SetHost calls that told only of the VMs
	// new or changed since the network's last round (SetVMs or
	// ChangeVMs): added and removed are the names the state dir gained
	// and lost, gone the MACs none of this network's VMs has any more.
	ChangeVMs(added, removed []string, gone []net.HardwareAddr)
	// SetForwards makes the network forward what fs say, to the VMs'
	// current addresses, following them as they change.
	SetForwards(ctx context.Context, fs []Forward) error
	// SetVMEgress gives VMs their own egress policies, in place of the
	// network's, following their addresses as they change.
	SetVMEgress(ctx context.Context, ps []VMEgress) error
	Leases() []Lease
	// Stats are the network's services' counters, and what q asks of its
	// ports.
	Stats(q StatsQuery) ServiceStats
	// Health is nil while the network's services (DHCP, DNS) run, else
	// why one stopped.
	Health() error
	Close() error
}

// TapCounter is a running network whose VM ports a VMM may drive itself
// (`attach: tap`): it reads their kernel counters, by port name; a port
// it could not read is missing. The controller reads them every stats
// interval for the helpers that hold such ports and count nothing
// (launch.CountedByCaller).
type TapCounter interface {
	TapCounts(taps []string) map[string]TapCounts
}

// Lease is one address handed out by a network's DHCP server (the lease
// store's type, which the backends share).
type Lease = leases.Lease

// The values a network and the controller exchange (package nettypes,
// below both backend and netplane), under backend's names.
type (
	TapCounts      = helperproto.TapCounts
	ServiceStats   = nettypes.ServiceStats
	StatsQuery     = nettypes.StatsQuery
	TunnelStats    = nettypes.TunnelStats
	WireGuardPeer  = nettypes.WireGuardPeer
	Forward        = nettypes.Forward
	VMEgress       = nettypes.VMEgress
	IPv6Stats      = nettypes.IPv6Stats
	DHCPStats      = nettypes.DHCPStats
	DNSStats       = nettypes.DNSStats
	FRRError       = nettypes.FRRError
	ClaimOptions   = nettypes.ClaimOptions
	DeniedFlow     = nettypes.DeniedFlow
	CaptureOptions = nettypes.CaptureOptions
	PortImpairment = nettypes.PortImpairment
	CaptureStats   = nettypes.CaptureStats
)

// ForwardKey names a port forward (nettypes.ForwardKey).
func ForwardKey(key string, pf api.PortForward) string { return nettypes.ForwardKey(key, pf) }

// ForwardKeyPrefix starts every ForwardKey.
const ForwardKeyPrefix = nettypes.ForwardKeyPrefix
