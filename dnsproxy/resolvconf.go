package dnsproxy

import (
	"net"
	"net/netip"

	"github.com/miekg/dns"
)

// ResolvConfServers returns the name servers of a resolv.conf file as
// host:port. With skipLoopback, loopback addresses are left out: they are
// right for the proxy, which runs on the host, but useless to hand to a VM.
func ResolvConfServers(path string, skipLoopback bool) ([]string, error) {
	cfg, err := dns.ClientConfigFromFile(path)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, s := range cfg.Servers {
		a, err := netip.ParseAddr(s)
		if err != nil || (skipLoopback && a.IsLoopback()) {
			continue
		}
		out = append(out, net.JoinHostPort(a.String(), cfg.Port))
	}
	return out, nil
}

// HostResolvers returns the IPv4 resolvers that a VM can use directly, for
// the DHCP DNS option of a network without DNS proxy. A host running
// systemd-resolved lists only its stub 127.0.0.53 in /etc/resolv.conf; the
// real upstreams are then in /run/systemd/resolve/resolv.conf.
func HostResolvers(paths ...string) []netip.Addr {
	for _, p := range paths {
		servers, err := ResolvConfServers(p, true)
		if err != nil {
			continue
		}
		var out []netip.Addr
		for _, s := range servers {
			if ap, err := netip.ParseAddrPort(s); err == nil && ap.Addr().Is4() {
				out = append(out, ap.Addr())
			}
		}
		if len(out) > 0 {
			return out
		}
	}
	return nil
}
