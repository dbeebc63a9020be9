package netplane

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/miekg/dns"
	"github.com/vmnetctl/vmnetctl/backend"
)

// localTTL is the TTL of the proxy's own answers: short, since VMs come and go.
const localTTL = 5

// upstreamTimeout bounds one query to one upstream resolver.
const upstreamTimeout = 3 * time.Second

// dnsHandler answers a network's VMs: names of VMs from resolve, the rest
// from the host's resolvers.
type dnsHandler struct {
	resolve   func(name string) (netip.Addr, bool)
	upstreams []string // host:port
	// dial opens a connection to an upstream. It exists because the proxy
	// must dial from the network namespace it was started in, which a
	// goroutine's thread is not guaranteed to be in.
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
	log  *slog.Logger

	mu    sync.Mutex
	stats backend.DNSStats
}

func (h *dnsHandler) count(f func(s *backend.DNSStats)) {
	h.mu.Lock()
	f(&h.stats)
	h.mu.Unlock()
}

// Stats returns a copy of the counters.
func (h *dnsHandler) Stats() backend.DNSStats {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.stats
}

// ServeDNS implements dns.Handler.
func (h *dnsHandler) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	h.count(func(s *backend.DNSStats) { s.Queries++ })
	if len(r.Question) == 1 && r.Question[0].Qclass == dns.ClassINET {
		q := r.Question[0]
		name, inZone, ok := localName(q.Name)
		if inZone || ok {
			var ip netip.Addr
			found := false
			if ok {
				ip, found = h.resolve(name)
			}
			switch {
			case found:
				m := new(dns.Msg)
				m.SetReply(r)
				m.Authoritative = true
				if q.Qtype == dns.TypeA || q.Qtype == dns.TypeANY {
					m.Answer = append(m.Answer, &dns.A{
						Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: localTTL},
						A:   net.IP(ip.AsSlice()),
					})
				}
				h.count(func(s *backend.DNSStats) { s.Local++ })
				w.WriteMsg(m)
				return
			case inZone:
				m := new(dns.Msg)
				m.SetRcode(r, dns.RcodeNameError)
				m.Authoritative = true
				h.count(func(s *backend.DNSStats) { s.NXDomain++ })
				w.WriteMsg(m)
				return
			}
			// An unknown bare name may still mean something upstream.
		}
	}
	h.forward(w, r)
}

func (h *dnsHandler) forward(w dns.ResponseWriter, r *dns.Msg) {
	network := "udp"
	if _, ok := w.LocalAddr().(*net.TCPAddr); ok {
		network = "tcp"
	}
	c := &dns.Client{Net: network, Timeout: upstreamTimeout}
	for _, up := range h.upstreams {
		resp, err := h.exchange(c, network, up, r)
		if err != nil {
			h.log.Debug("upstream resolver failed", "upstream", up, "err", err)
			continue
		}
		h.count(func(s *backend.DNSStats) { s.Forwarded++ })
		resp.Id = r.Id
		w.WriteMsg(resp)
		return
	}
	h.count(func(s *backend.DNSStats) { s.ForwardErrors++ })
	m := new(dns.Msg)
	m.SetRcode(r, dns.RcodeServerFailure)
	w.WriteMsg(m)
}

func (h *dnsHandler) exchange(c *dns.Client, network, upstream string, r *dns.Msg) (*dns.Msg, error) {
	ctx, cancel := context.WithTimeout(context.Background(), upstreamTimeout)
	defer cancel()
	conn, err := h.dial(ctx, network, upstream)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(upstreamTimeout))
	resp, _, err := c.ExchangeWithConn(r, &dns.Conn{Conn: conn})
	return resp, err
}

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

// hostResolvers returns the IPv4 resolvers that a VM can use directly, for
// the DHCP DNS option of a network without DNS proxy. A host running
// systemd-resolved lists only its stub 127.0.0.53 in /etc/resolv.conf; the
// real upstreams are then in /run/systemd/resolve/resolv.conf.
func hostResolvers(paths ...string) []netip.Addr {
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
