// Package backend is what differs between platforms, behind one neutral
// interface: who provides a network, and which helper connects a VM to it.
// On Linux (package linuxnet) vmnetctl is the data plane (netplane) and its
// own `vmnetctl helper` the helper; on macOS (package vmnethelper) vmnet is
// the data plane and vmnet-helper the helper. The controller is the same for
// both, and sees only the types of this package.
package backend

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/dhcpserver"
	"github.com/vmnetctl/vmnetctl/leases"
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
	// of one no longer there loses its claim. reread reads the claims
	// from the kernel rather than trusting what this process last wrote
	// (a full pass: a change behind its back).
	ClaimPorts(ctx context.Context, n *api.Network, atts []*api.Attachment, reread bool) error
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
	// is pending into it, until ctx ends.
	Changes(ctx context.Context) (<-chan struct{}, error)
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
	// SetForwards makes the network forward what fs say, to the VMs'
	// current addresses, following them as they change.
	SetForwards(ctx context.Context, fs []Forward) error
	// SetVMEgress gives VMs their own egress policies, in place of the
	// network's, following their addresses as they change.
	SetVMEgress(ctx context.Context, ps []VMEgress) error
	Leases() []Lease
	// Stats are the network's services' counters; with ports (VM port
	// names) not nil, what is per port is of those ports only.
	Stats(ports []string) ServiceStats
	// Health is nil while the network's services (DHCP, DNS) run, else
	// why one stopped.
	Health() error
	Close() error
}

// Lease is one address handed out by a network's DHCP server (the lease
// store's type, which the backends share).
type Lease = leases.Lease

// ServiceStats count a network's DHCP and DNS traffic since it started;
// zero where the backend's services are not vmnetctl's.
type ServiceStats struct {
	DHCP DHCPStats `json:"dhcp"`
	DNS  DNSStats  `json:"dns"`
	// GuardDrops counts the frames the anti-spoofing guard dropped, by
	// VM port (the helper's tap_name); nil where the backend has no guard.
	GuardDrops map[string]uint64 `json:"guardDrops,omitempty"`
	// PortMACs are the MACs the network's bridge learned on each VM port,
	// by port name; nil where the backend cannot tell.
	PortMACs map[string][]string `json:"portMACs,omitempty"`
	// IPv6 counts the network's router advertisements and the IPv6
	// addresses it learned its VMs use; zero without IPv6.
	IPv6 IPv6Stats `json:"ipv6"`
	// IPv6Addrs are the IPv6 addresses each VM uses, by MAC, as the
	// network learned them from neighbour discovery; nil without IPv6.
	IPv6Addrs map[string][]netip.Addr `json:"ipv6Addrs,omitempty"`
	// ForwardConns counts the connections (new flows, for UDP) each port
	// forward took, by netplane.ForwardKey; nil where the backend has none.
	ForwardConns map[string]uint64 `json:"forwardConns,omitempty"`
	// EgressDenied counts the connections the network's egress policy
	// refused.
	EgressDenied uint64 `json:"egressDenied,omitempty"`
	// EgressDeniedByMAC is EgressDenied by the VM that opened them.
	EgressDeniedByMAC map[string]uint64 `json:"egressDeniedByMAC,omitempty"`
	// NeighLimited counts the connections the network's VMs opened to
	// next hops past the bound on the host's neighbour entries.
	NeighLimited uint64 `json:"neighLimited,omitempty"`
	// Tunnel is the network's segment across hosts on this host; nil for a
	// network of this host alone.
	Tunnel *TunnelStats `json:"tunnel,omitempty"`
}

// TunnelStats is what a network across hosts looks like from this host.
type TunnelStats struct {
	// Host is this host's name in the segment's list.
	Host string `json:"host"`
	// Peers are the underlay addresses the tunnel floods to.
	Peers []string `json:"peers"`
	// RemoteMACs counts the MACs the bridge learned behind the tunnel
	// (the forwarding entries of the other hosts' VMs).
	RemoteMACs int `json:"remoteMACs"`
	// TxBytes and RxBytes are the tunnel device's counters: the segment's
	// frames sent to and received from the other hosts.
	TxBytes uint64 `json:"txBytes"`
	RxBytes uint64 `json:"rxBytes"`
	// Dropped counts frames from the other hosts the tunnel's guard kept
	// off this host's side (their gateways' traffic, DHCP, routers).
	Dropped uint64 `json:"dropped"`
	// BGPPeers, for a segment with EVPN, is how many sessions it should
	// have (one per other host); BGPError why FRR could not be asked.
	BGPPeers int    `json:"bgpPeers,omitempty"`
	BGPError string `json:"bgpError,omitempty"`
	// BGPSessions, for a segment with EVPN, is the state of FRR's BGP
	// session with each other host (by underlay address): "Established",
	// "Active", "Connect"...; a host without a session is missing.
	BGPSessions map[string]string `json:"bgpSessions,omitempty"`
	// WireGuard are the peers of the segment's WireGuard device, if its
	// underlay is encrypted.
	WireGuard []WireGuardPeer `json:"wireguard,omitempty"`
}

// BGPEstablished counts the established sessions of BGPSessions.
func (t *TunnelStats) BGPEstablished() int {
	n := 0
	for _, s := range t.BGPSessions {
		if s == "Established" {
			n++
		}
	}
	return n
}

// WireGuardPeer is another host as this host's WireGuard device sees it.
type WireGuardPeer struct {
	Host string `json:"host"`
	// LastHandshake is the time of the last completed handshake; zero
	// for none. A session older than 3 minutes is renewed or dead.
	LastHandshake time.Time `json:"lastHandshake"`
	// RxBytes and TxBytes count the encrypted bytes from and to the peer.
	RxBytes uint64 `json:"rxBytes"`
	TxBytes uint64 `json:"txBytes"`
}

// Forward is one port forward of an attachment (api.PortForward), to the
// VM with MAC on the network.
type Forward struct {
	api.PortForward
	// Key is the attachment's ("vm/index"): ServiceStats.ForwardConns
	// names the forward by it and the forward (netplane.ForwardKey).
	Key string
	MAC string
}

// VMEgress is a VM's own egress policy on a network (its VM file entry's).
type VMEgress struct {
	MAC    string
	Egress *api.Egress
}

// IPv6Stats count a network's IPv6 services since it started.
type IPv6Stats struct {
	// RouterAdvertisements sent, router Solicitations received, and
	// those SolicitationsLimited by the rate limit (answered by one RA).
	RouterAdvertisements uint64 `json:"routerAdvertisements"`
	Solicitations        uint64 `json:"solicitations"`
	SolicitationsLimited uint64 `json:"solicitationsLimited"`
	// Bindings are the (MAC, address) pairs in force; Claims the claims
	// heard; Conflicts the claims of an address another VM holds
	// (refused); Refused the new claims past 4096 bindings in the
	// network (a VM's 17th address replaces its oldest instead).
	Bindings  uint64 `json:"bindings"`
	Claims    uint64 `json:"claims"`
	Conflicts uint64 `json:"conflicts"`
	Refused   uint64 `json:"refused"`
}

// DHCPStats count a DHCP server's traffic (the DHCP server's type).
type DHCPStats = dhcpserver.Stats

// DNSStats count a DNS proxy's queries since it started.
type DNSStats struct {
	Queries       uint64 `json:"queries"`       // every query received
	Local         uint64 `json:"local"`         // answered from the VM table
	NXDomain      uint64 `json:"nxdomain"`      // unknown names under vmnet.internal
	Forwarded     uint64 `json:"forwarded"`     // answered by an upstream resolver
	ForwardErrors uint64 `json:"forwardErrors"` // no upstream answered: SERVFAIL
	Refused       uint64 `json:"refused"`       // not the network's own name, and forwarding off: REFUSED
	Dropped       uint64 `json:"dropped"`       // unanswered: too many queries (or TCP connections) in flight
}

// ForwardKey names a port forward of the attachment key ("vm/index"): its
// entry in ServiceStats.ForwardConns and, in vmnetctl's data plane, the
// nftables counter of its connections: "fwd-vm-index-" and a hash of the
// forward, so that a forward keeps its count when others around it change.
func ForwardKey(key string, pf api.PortForward) string {
	sum := sha256.Sum256([]byte(pf.String()))
	return ForwardKeyPrefix + strings.ReplaceAll(key, "/", "-") + "-" + hex.EncodeToString(sum[:4])
}

// ForwardKeyPrefix starts every ForwardKey.
const ForwardKeyPrefix = "fwd-"
