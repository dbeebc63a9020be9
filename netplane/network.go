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
