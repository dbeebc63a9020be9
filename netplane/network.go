package netplane

import (
	"log/slog"
	"net/netip"

	"github.com/vmnetctl/vmnetctl/nettypes"
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
	// OnLease, if set, is told of leases granted (new, or a new address),
	// released and declined (backend.NetworkOptions.OnLease).
	OnLease func(kind, network, mac string, ip netip.Addr)
	// OnEgressDenied, if set, is told of connections the network's VMs
	// opened that an egress policy refused, a few a VM
	// (backend.NetworkOptions.OnEgressDenied).
	OnEgressDenied func(network string, f nettypes.DeniedFlow)
}
