package ctlapi

import (
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/backend"
)

// Status is `vmnetctl status --json`: a stable contract. Fields are only
// ever added. See docs/controller.md.
type Status struct {
	Controller  ControllerStatus   `json:"controller"`
	Networks    []NetworkStatus    `json:"networks"`
	Attachments []AttachmentStatus `json:"attachments"`
	Skipped     []string           `json:"skipped,omitempty"`
}

// ControllerStatus tells whether a controller runs for the state dir.
type ControllerStatus struct {
	Running       bool    `json:"running"`
	PID           int     `json:"pid,omitempty"`
	StateDir      string  `json:"stateDir"`
	UptimeSeconds float64 `json:"uptimeSeconds,omitempty"`
	LastError     string  `json:"lastError,omitempty"`
}

// NetworkStatus is one network that some attachment uses.
type NetworkStatus struct {
	Name      string `json:"name"`
	Mode      string `json:"mode"`
	Bridge    string `json:"bridge,omitempty"`
	Interface string `json:"interface,omitempty"`
	Subnet    string `json:"subnet,omitempty"`
	Gateway   string `json:"gateway,omitempty"`
	// Subnet6 and Gateway6 are the network's IPv6 prefix and gateway;
	// NAT66 whether its IPv6 traffic leaves the host (through NAT66).
	Subnet6  string   `json:"subnet6,omitempty"`
	Gateway6 string   `json:"gateway6,omitempty"`
	NAT66    bool     `json:"nat66,omitempty"`
	VMs      []string `json:"vms"`
	// State is "up" when the kernel has the network as configured, "down"
	// when it is missing, "degraded" with Error set when something changed
	// it behind vmnetctl's back and a repair has not (yet) put it back,
	// "error" with Error set otherwise.
	State  string `json:"state"`
	Error  string `json:"error,omitempty"`
	Leases int    `json:"leases"`
	// Repairs counts the times the controller found the network changed
	// behind its back and put it back.
	Repairs uint64 `json:"repairs"`
	// Partitions are the network's groups of VMs that reach no other
	// group's, as its file gives them ("[a, b], [c]").
	Partitions string `json:"partitions,omitempty"`
	// Egress is the network's egress policy as its file gives it
	// (api.Egress's words), "" for none.
	Egress string `json:"egress,omitempty"`
	// EgressDenied counts the connections its VMs opened that the
	// network's egress policy refused.
	EgressDenied uint64 `json:"egressDenied,omitempty"`
	// NeighLimited counts the connections its VMs opened to more next
	// hops than the host's neighbour table may hold for the network
	// (docs/security.md), refused.
	NeighLimited uint64 `json:"neighLimited,omitempty"`
	// Tunnel is the network's segment across hosts as this host sees it
	// (docs/multihost.md); absent for a network of this host alone.
	Tunnel *backend.TunnelStats `json:"tunnel,omitempty"`
}

// AttachmentStatus is one VM's cable to one network.
type AttachmentStatus struct {
	VM      string `json:"vm"`
	Index   int    `json:"index"`
	Network string `json:"network"`
	Project string `json:"project"`
	MAC     string `json:"mac"`
	Attach  string `json:"attach"`
	Socket  string `json:"socket"`
	Tap     string `json:"tap"`
	IP      string `json:"ip"`
	// IPv6 are the VM's addresses in the network's IPv6 prefix, as the
	// network learned them (SLAAC: the VM makes its own).
	IPv6     []string `json:"ipv6,omitempty"`
	PID      int      `json:"pid"`
	State    string   `json:"state"`
	Restarts int      `json:"restarts"`
	// UptimeSeconds is how long the current helper has run.
	UptimeSeconds float64 `json:"uptimeSeconds"`
	Error         string  `json:"error,omitempty"`
	// Cumulative counters from the helper's stats: To is towards the VM.
	RxBytes uint64 `json:"rxBytes"`
	TxBytes uint64 `json:"txBytes"`
	Drops   uint64 `json:"drops"`
	// Egress is the VM's own egress policy on the network, in place of
	// the network's, "" for none.
	Egress string `json:"egress,omitempty"`
	// EgressDenied counts the connections the VM opened that its
	// network's egress policy refused (networks with one).
	EgressDenied uint64 `json:"egressDenied,omitempty"`
	// Bandwidth is the attachment's limits as its VM file gives them
	// (bits a second; Linux enforces them on its port).
	Bandwidth *api.Bandwidth `json:"bandwidth,omitempty"`
	// Impair is what the attachment's link loses on purpose, as its VM
	// file gives it.
	Impair *api.Impairment `json:"impair,omitempty"`
	// ImpairSetBy is "vmnetctl impair" when that command set Impair in
	// place of the VM file's, which ImpairFile then holds.
	ImpairSetBy string          `json:"impairSetBy,omitempty"`
	ImpairFile  *api.Impairment `json:"impairFile,omitempty"`
	// Forwards are the attachment's port forwards, with the connections
	// each took.
	Forwards []ForwardStatus `json:"forwards,omitempty"`
	// SpoofDrops counts the frames from the VM that the anti-spoofing
	// guard dropped (Linux; docs/security.md).
	SpoofDrops uint64 `json:"spoofDrops"`
	// Peer is whether the VM is there: "connected", "waiting for VM"
	// (no VMM came yet), "VM gone" (its VMM's socket is gone), or ""
	// when the helper does not run.
	Peer string `json:"peer,omitempty"`
	// LastFrameAt is when the helper last counted a frame from the VM.
	LastFrameAt time.Time `json:"lastFrameAt,omitzero"`
	// StatsAt is when the attachment's latest counters were taken: its
	// helper's latest stats line (a new one while they move, one every
	// 60 stats intervals while they do not), or for `attach: tap` the
	// controller's latest read of its TAP's that found them moved.
	StatsAt time.Time `json:"statsAt,omitzero"`
	// SeenMACs are the MACs the bridge learned on the VM's port (Linux):
	// the VM's, which should be MAC.
	SeenMACs []string `json:"seenMACs,omitempty"`
	// Current rates over the helper's latest stats interval, in bits per
	// second: Rx is what the VM sent, Tx what it was sent. Zero until the
	// helper has reported twice, and when it stopped reporting.
	RxBitsPerSecond float64 `json:"rxBitsPerSecond"`
	TxBitsPerSecond float64 `json:"txBitsPerSecond"`
}

// ForwardStatus is one port forward: "HOSTIP:PORT -> GUESTPORT/PROTO".
type ForwardStatus struct {
	Forward     string `json:"forward"`
	Connections uint64 `json:"connections"`
}

// Helper states, as `status` shows them.
const (
	StateStarting = "starting"
	StateRunning  = "running"
	StateBackoff  = "backoff"
	StateStopped  = "stopped"
	StateFailed   = "failed"
)
