package netplane

import (
	"log/slog"
)

// Options configure Start.
type Options struct {
	// StateDir holds the lease files, <StateDir>/<id>.leases.json. Empty
	// keeps leases in memory only.
	StateDir string
	// Upstreams are the resolvers the DNS proxy forwards to, as host:port.
	// Empty means the name servers of ResolvConf.
	Upstreams []string
	// ResolvConf is read for upstream resolvers; default /etc/resolv.conf.
	ResolvConf string
	// Log receives the services' events; default slog.Default().
	Log *slog.Logger
}

// Stats are a running network's counters and leases.
type Stats struct {
	DHCP   DHCPStats `json:"dhcp"`
	DNS    DNSStats  `json:"dns"`
	Leases []Lease   `json:"leases"`
}

// DHCPStats counts a DHCP server's traffic since it started.
type DHCPStats struct {
	// Requests counts received messages by DHCP message type
	// ("DISCOVER", "REQUEST", "RELEASE", "DECLINE", "INFORM", "other").
	Requests map[string]uint64 `json:"requests"`
	// Replies counts sent messages by type ("OFFER", "ACK", "NAK").
	Replies map[string]uint64 `json:"replies"`
	// Errors counts messages dropped: unparsable, not for us, no address left,
	// or a reply that could not be sent.
	Errors uint64 `json:"errors"`
}

// DNSStats counts a DNS proxy's queries since it started.
type DNSStats struct {
	Queries       uint64 `json:"queries"`       // every query received
	Local         uint64 `json:"local"`         // answered from the VM table
	NXDomain      uint64 `json:"nxdomain"`      // unknown names under vmnet.internal
	Forwarded     uint64 `json:"forwarded"`     // answered by an upstream resolver
	ForwardErrors uint64 `json:"forwardErrors"` // no upstream answered: SERVFAIL
}
