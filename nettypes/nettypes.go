// Package nettypes holds the values a network of the data plane and the
// controller exchange: its services' counters (ServiceStats), its VMs'
// port forwards and egress policies, and what is wrong with FRR's part of
// a segment. It is a leaf below both: backend gives them its own names
// (aliases), and netplane, which the Linux backend composes, need not
// import backend back (docs/architecture.md, "Import order").
package nettypes

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"golang.org/x/net/bpf"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/dhcpserver"
)

// StatsQuery says what a network's Stats reads besides its services'
// counters.
type StatsQuery struct {
	// Ports (VM port names), if not nil, are the only ports whose
	// per-port values (guard drops, learned MACs) are read; nil is all.
	Ports []string
	// MACs asks for the MACs the bridge learned on each port (PortMACs):
	// a status shows them, a scrape does not. The kernel answers a dump of
	// one port's entries with a walk of the bridge's whole database, so
	// reading them port by port costs ports times VMs.
	MACs bool
}

// ServiceStats count a network's DHCP and DNS traffic since it started;
// zero where the backend's services are not vmnetctl's.
type ServiceStats struct {
	DHCP DHCPStats `json:"dhcp"`
	DNS  DNSStats  `json:"dns"`
	// GuardDrops counts the frames the anti-spoofing guard dropped, by
	// VM port (the helper's tap_name); nil where the backend has no guard.
	GuardDrops map[string]uint64 `json:"guardDrops,omitempty"`
	// PortMACs are the MACs the network's bridge learned on each VM port,
	// by port name; nil where the backend cannot tell or the query did
	// not ask (StatsQuery.MACs).
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

// CaptureOptions say what a capture of a VM's port takes: its name in
// the capture (pcapng's interfaces are "NAME: from the VM" and "NAME: to
// the VM"), and when it ends: after Count frames, after Duration, or when
// its reader goes (0: no bound).
type CaptureOptions struct {
	Name     string
	Count    int
	Duration time.Duration
	// Filter, if set, is the classic BPF program a frame must pass
	// (`capture --filter`, compiled by libpcap).
	Filter []bpf.RawInstruction
	// Ring, if set, makes the capture a flight recorder: it keeps the
	// last Ring bytes of frames in memory, and writes them only when it
	// ends: after Count frames, after Duration, when its reader goes,
	// when the port goes (its helper exited), or when Until says why.
	Ring int
	// Until, if set, is asked a few times a second whether the capture
	// should end now, and why ("" to go on).
	Until func() string
	// Bound, if set, is called once the capture's socket is bound: it
	// hears every frame from then on.
	Bound func()
}

// PortImpairment is what a VM's port does to its frames on purpose: its
// attachment's api.Impairment, by the port's name.
type PortImpairment struct {
	Port string
	api.Impairment
}

// CaptureStats is what a capture wrote, and the frames the kernel dropped
// because its reader was slower than the VM.
type CaptureStats struct {
	Frames, Dropped uint64
	// Ended is why the capture ended when its port went, Until said so,
	// or its ctx ended ("interrupted"); "" when its count or duration
	// ended it.
	Ended string
}

// DeniedFlow is a connection a VM opened that an egress policy refused.
type DeniedFlow struct {
	// MAC is the VM's, by the source address's lease or IPv6 binding;
	// "" when none has it.
	MAC string
	// Proto is tcp, udp, icmp or "proto N"; Src and Dst its addresses,
	// with the ports of TCP and UDP.
	Proto    string
	Src, Dst netip.AddrPort
	// Name is the name the VM asked the network's DNS proxy for that
	// gave Dst, if it did.
	Name string
	// Why is what the name check refused, when it did ("TLS names
	// \"x.test\", which the policy does not allow"); "" for the kernel's
	// refusal by address.
	Why string
	// Suppressed counts the denied flows of this source left untold
	// since the last one told (at most one in 10 s).
	Suppressed int
}

// String is "tcp 10.0.0.5:51234 -> 1.2.3.4:443 (example.com)", and why
// when the name check refused it.
func (f DeniedFlow) String() string {
	addr := func(a netip.AddrPort) string {
		if a.Port() == 0 {
			return a.Addr().String()
		}
		return a.String()
	}
	s := f.Proto + " " + addr(f.Src) + " -> " + addr(f.Dst)
	if f.Name != "" {
		s += " (" + f.Name + ")"
	}
	if f.Why != "" {
		s += ": " + f.Why
	}
	if f.Suppressed > 0 {
		s += fmt.Sprintf("; %d more not shown", f.Suppressed)
	}
	return s
}

// ClaimOptions say how much of a network's guard a pass of the controller
// reads before it claims the VMs' MACs (backend.ClaimPorts).
type ClaimOptions struct {
	// Reread reads the claims from the kernel rather than trusting what
	// the controller last wrote (a full pass: a change behind its back).
	Reread bool
	// PortsGone says that some of the network's ports, not known which,
	// may have gone since the last claims (a helper of an older vmnetctl
	// stopped or exited): the guards of ports that have no link any more
	// are looked for among all of them and removed. Without it, or
	// Reread, a pass that only attaches VMs reads none of the other
	// ports' guards.
	PortsGone bool
	// GonePorts are the interface indexes of ports that may have gone
	// since the last claims (their helpers stopped or exited: the ready
	// line's tap_index): those alone are looked at, a guard whose port
	// has no link is removed. A VM's detach costs the same however many
	// ports the network has.
	GonePorts []uint32
	// Changed, if set, says that the network's attachments differ from
	// those of its last claims in this process, which succeeded, only in
	// these: the claims of their ports alone may then be changed, from
	// what the last claims left (guard.ClaimPortsChanged), and the
	// attachments given are read only where that cannot tell.
	Changed *ClaimChanges
}

// ClaimChanges are the attachments of a network that changed since its
// last claims: Added are as they are now (new, or changed), Removed as they
// were then (gone, or changed).
type ClaimChanges struct {
	Added, Removed []*api.Attachment
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

// FRRError is what CheckNetwork finds wrong in the FRR part of a segment
// with EVPN (api.EVPN): FRR lost the configuration vmnetctl gave it (it
// restarted), or does not answer (not running, bgpd off, hung). That part
// is repaired on its own (FRREnsurer), and the network, whose services the
// local VMs need whatever FRR does, runs meanwhile (degraded).
type FRRError struct {
	Err error
	// Unreachable: FRR does not answer, and so cannot be repaired now.
	Unreachable bool
}

func (e *FRRError) Error() string { return e.Err.Error() }
func (e *FRRError) Unwrap() error { return e.Err }
