package dnsproxy

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/miekg/dns"
	"github.com/vmnetctl/vmnetctl/nettypes"
)

// LocalTTL is the TTL of the proxy's own answers: short, since VMs come and go.
const LocalTTL = 5

// UpstreamTimeout bounds one query to one upstream resolver.
const UpstreamTimeout = 3 * time.Second

// MaxInFlight bounds the queries a network's proxy forwards at once. A
// query beyond it is dropped unanswered (and counted): the client retries,
// and a VM flooding the proxy with names a silent upstream never answers
// holds at most this many goroutines and upstream sockets.
const MaxInFlight = 64

// MaxTCPConns bounds the TCP connections a network's proxy serves at once
// (miekg/dns runs a goroutine per connection); one beyond it is closed at
// once and counted as dropped.
const MaxTCPConns = 16

// MaxTCPQueries bounds the queries one TCP connection may make (miekg/dns
// allows 128): with its 8 s idle timeout, a client that sends a query every
// 7 s holds a slot for a minute at most, not 17.
const MaxTCPQueries = 8

// Proxy answers a network's VMs: names of VMs from resolve, the rest
// from the host's resolvers when forwarding is on, else REFUSED.
type Proxy struct {
	Resolve func(name string) (netip.Addr, bool)
	// Resolve6, if set, gives the IPv6 addresses of a name (AAAA).
	Resolve6 func(name string) []netip.Addr
	// Learn, if set, is told of each answer forwarded, before the client
	// hears it (the egress policy's names).
	Learn func(client netip.Addr, qname string, answers []dns.RR)
	// NoECH, if set, says of a client whether its answers lose their
	// ECH configurations (the `ech` of HTTPS and SVCB records): a
	// client under a name policy, whose encrypted ClientHello the name
	// check refuses, then sends a plain one.
	NoECH func(client netip.Addr) bool
	// Remote, if set, looks a name up on the other hosts of the network's
	// segment; FileName tells whether a name is one of a VM file here,
	// which no other host's name can take.
	Remote    func(name string) (PeerAnswer, bool)
	FileName  func(name string) bool
	Upstreams []string // host:port
	// NoForward refuses every name that is not the network's own (a host
	// network without dnsForward: its VMs must not reach names outside).
	NoForward bool
	// Dial opens a connection to an upstream (or another host). It exists
	// because the proxy must dial from the network namespace it was
	// started in, which a goroutine's thread is not guaranteed to be in.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	Log  *slog.Logger

	// inFlight holds a token per query being forwarded (MaxInFlight when
	// nil, made on first use).
	inFlight chan struct{}
	once     sync.Once
	// idle holds upstream connections between queries, by network and
	// upstream: forwarding reuses them rather than opening a socket per
	// query.
	idle map[poolKey]chan *dns.Conn

	mu    sync.Mutex
	stats nettypes.DNSStats
}

type poolKey struct{ network, upstream string }

func (h *Proxy) init() {
	h.once.Do(func() {
		if h.inFlight == nil {
			h.inFlight = make(chan struct{}, MaxInFlight)
		}
		h.idle = map[poolKey]chan *dns.Conn{}
		for _, network := range []string{"udp", "tcp"} {
			for _, up := range h.Upstreams {
				h.idle[poolKey{network, up}] = make(chan *dns.Conn, cap(h.inFlight))
			}
		}
	})
}

func (h *Proxy) count(f func(s *nettypes.DNSStats)) {
	h.mu.Lock()
	f(&h.stats)
	h.mu.Unlock()
}

// Stats returns a copy of the counters.
func (h *Proxy) Stats() nettypes.DNSStats {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.stats
}

// ServeDNS implements dns.Handler.
func (h *Proxy) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	h.init()
	h.count(func(s *nettypes.DNSStats) { s.Queries++ })
	if len(r.Question) == 1 && r.Question[0].Qclass == dns.ClassINET {
		q := r.Question[0]
		name, inZone, ok := LocalName(q.Name)
		if inZone || ok {
			var ip netip.Addr
			var ip6 []netip.Addr
			found := false
			if ok {
				ip, found = h.Resolve(name)
				if h.Resolve6 != nil {
					ip6 = h.Resolve6(name)
					found = found || len(ip6) > 0
				}
				// Across hosts: a VM file's name elsewhere wins over a
				// DHCP host name here, as a VM file's name here does.
				if h.Remote != nil && (!found || h.FileName == nil || !h.FileName(name)) {
					if a, ok := h.Remote(name); ok && (a.ByFile || !found) {
						ip, ip6, found = a.IP, a.IP6, true
					}
				}
			}
			switch {
			case found:
				m := new(dns.Msg)
				m.SetReply(r)
				m.Authoritative = true
				if ip.IsValid() && (q.Qtype == dns.TypeA || q.Qtype == dns.TypeANY) {
					m.Answer = append(m.Answer, &dns.A{
						Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: LocalTTL},
						A:   net.IP(ip.AsSlice()),
					})
				}
				if q.Qtype == dns.TypeAAAA || q.Qtype == dns.TypeANY {
					for _, a := range ip6 {
						m.Answer = append(m.Answer, &dns.AAAA{
							Hdr:  dns.RR_Header{Name: q.Name, Rrtype: dns.TypeAAAA, Class: dns.ClassINET, Ttl: LocalTTL},
							AAAA: net.IP(a.AsSlice()),
						})
					}
				}
				h.count(func(s *nettypes.DNSStats) { s.Local++ })
				w.WriteMsg(m)
				return
			case inZone:
				m := new(dns.Msg)
				m.SetRcode(r, dns.RcodeNameError)
				m.Authoritative = true
				h.count(func(s *nettypes.DNSStats) { s.NXDomain++ })
				w.WriteMsg(m)
				return
			}
			// An unknown bare name may still mean something upstream.
		}
	}
	if h.NoForward {
		m := new(dns.Msg)
		m.SetRcode(r, dns.RcodeRefused)
		h.count(func(s *nettypes.DNSStats) { s.Refused++ })
		w.WriteMsg(m)
		return
	}
	select {
	case h.inFlight <- struct{}{}:
	default:
		// Full: drop. The goroutine miekg/dns started for this query
		// ends here, so goroutines and sockets stay bounded however fast
		// queries come and however slow the upstreams are.
		h.CountDropped()
		return
	}
	defer func() { <-h.inFlight }()
	h.forward(w, r)
}

func (h *Proxy) forward(w dns.ResponseWriter, r *dns.Msg) {
	network := "udp"
	if _, ok := w.LocalAddr().(*net.TCPAddr); ok {
		network = "tcp"
	}
	for _, up := range h.Upstreams {
		resp, err := h.exchange(network, up, r)
		if err != nil {
			h.Log.Debug("upstream resolver failed", "upstream", up, "err", err)
			continue
		}
		h.count(func(s *nettypes.DNSStats) { s.Forwarded++ })
		var client netip.Addr
		switch a := w.RemoteAddr().(type) {
		case *net.UDPAddr:
			client = a.AddrPort().Addr().Unmap()
		case *net.TCPAddr:
			client = a.AddrPort().Addr().Unmap()
		}
		if h.Learn != nil && len(r.Question) == 1 {
			h.Learn(client, r.Question[0].Name, resp.Answer)
		}
		if h.NoECH != nil && h.NoECH(client) {
			withoutECH(resp.Answer)
			withoutECH(resp.Extra)
		}
		resp.Id = r.Id
		w.WriteMsg(resp)
		return
	}
	h.count(func(s *nettypes.DNSStats) { s.ForwardErrors++ })
	m := new(dns.Msg)
	m.SetRcode(r, dns.RcodeServerFailure)
	w.WriteMsg(m)
}

// withoutECH removes the ECH configurations from the HTTPS and SVCB
// records among rrs. (A client that validates DNSSEC itself finds their
// signatures broken, and goes on without the records.)
func withoutECH(rrs []dns.RR) {
	for _, rr := range rrs {
		var svcb *dns.SVCB
		switch v := rr.(type) {
		case *dns.HTTPS:
			svcb = &v.SVCB
		case *dns.SVCB:
			svcb = v
		default:
			continue
		}
		svcb.Value = slices.DeleteFunc(svcb.Value, func(kv dns.SVCBKeyValue) bool { return kv.Key() == dns.SVCB_ECHCONFIG })
	}
}

// exchange asks upstream over an idle connection of the pool, or a new
// one. The query goes out with an id of the proxy's own, so an answer that
// arrives late on a reused UDP socket (to a query that timed out) has
// another id and is skipped by the next exchange on it.
func (h *Proxy) exchange(network, upstream string, r *dns.Msg) (*dns.Msg, error) {
	pool := h.idle[poolKey{network, upstream}]
	q := r.Copy()
	q.Id = dns.Id()
	c := &dns.Client{Net: network, Timeout: UpstreamTimeout}
	for {
		co, reused, err := h.conn(pool, network, upstream)
		if err != nil {
			return nil, err
		}
		resp, _, err := c.ExchangeWithConn(q, co)
		if err == nil && !sameQuestion(resp, q) {
			err = errors.New("answer to another question")
		}
		if err == nil {
			h.put(pool, co)
			return resp, nil
		}
		var ne net.Error
		timeout := errors.As(err, &ne) && ne.Timeout()
		if timeout && network == "udp" {
			// A silent upstream: the socket is fine, and a late answer
			// on it will not match the next query's id.
			h.put(pool, co)
			return nil, err
		}
		co.Close()
		if !reused || timeout {
			return nil, err
		}
		// The upstream closed a reused connection (TCP idle timeout) or
		// refused on it: once more on a new one.
	}
}

// conn takes an idle connection of the pool, or dials a new one.
func (h *Proxy) conn(pool chan *dns.Conn, network, upstream string) (*dns.Conn, bool, error) {
	select {
	case co := <-pool:
		return co, true, nil
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), UpstreamTimeout)
	defer cancel()
	nc, err := h.Dial(ctx, network, upstream)
	if err != nil {
		return nil, false, err
	}
	return &dns.Conn{Conn: nc}, false, nil
}

// put returns a connection to the pool, or closes it when the pool is full.
func (h *Proxy) put(pool chan *dns.Conn, co *dns.Conn) {
	select {
	case pool <- co:
	default:
		co.Close()
	}
}

// CloseIdle closes the pooled upstream connections.
func (h *Proxy) CloseIdle() error {
	h.init()
	for _, pool := range h.idle {
		for drained := false; !drained; {
			select {
			case co := <-pool:
				co.Close()
			default:
				drained = true
			}
		}
	}
	return nil
}

func sameQuestion(resp, q *dns.Msg) bool {
	if len(resp.Question) != len(q.Question) {
		return false
	}
	for i, rq := range resp.Question {
		qq := q.Question[i]
		if rq.Qtype != qq.Qtype || rq.Qclass != qq.Qclass || LowerASCII(rq.Name) != LowerASCII(qq.Name) {
			return false
		}
	}
	return true
}

// CountDropped counts a query not answered.
func (h *Proxy) CountDropped() { h.count(func(s *nettypes.DNSStats) { s.Dropped++ }) }

// Slot takes one of the slots that bound the queries waiting on something
// else (an upstream, the other hosts); with none free it counts the query
// as dropped and says false. release gives the slot back.
func (h *Proxy) Slot() (release func(), ok bool) {
	h.init()
	select {
	case h.inFlight <- struct{}{}:
		return func() { <-h.inFlight }, true
	default:
		h.CountDropped()
		return nil, false
	}
}

// PeerAnswer is what another host knows of a name: its addresses, and
// whether it is a VM file's name there.
type PeerAnswer struct {
	IP     netip.Addr
	IP6    []netip.Addr
	ByFile bool
}

// AddressRRs are the A record of ip (if valid) and the AAAA records of
// ip6, as the proxy answers its own names.
func AddressRRs(qname string, ip netip.Addr, ip6 []netip.Addr) []dns.RR {
	var rrs []dns.RR
	if ip.IsValid() {
		rrs = append(rrs, &dns.A{Hdr: dns.RR_Header{Name: qname, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: LocalTTL}, A: net.IP(ip.AsSlice())})
	}
	for _, a := range ip6 {
		rrs = append(rrs, &dns.AAAA{Hdr: dns.RR_Header{Name: qname, Rrtype: dns.TypeAAAA, Class: dns.ClassINET, Ttl: LocalTTL}, AAAA: net.IP(a.AsSlice())})
	}
	return rrs
}
