package netplane

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/miekg/dns"
	"github.com/vmnetctl/vmnetctl/nettypes"
)

// localTTL is the TTL of the proxy's own answers: short, since VMs come and go.
const localTTL = 5

// upstreamTimeout bounds one query to one upstream resolver.
const upstreamTimeout = 3 * time.Second

// maxInFlight bounds the queries a network's proxy forwards at once. A
// query beyond it is dropped unanswered (and counted): the client retries,
// and a VM flooding the proxy with names a silent upstream never answers
// holds at most this many goroutines and upstream sockets.
const maxInFlight = 64

// maxTCPConns bounds the TCP connections a network's proxy serves at once
// (miekg/dns runs a goroutine per connection); one beyond it is closed at
// once and counted as dropped.
const maxTCPConns = 16

// maxTCPQueries bounds the queries one TCP connection may make (miekg/dns
// allows 128): with its 8 s idle timeout, a client that sends a query every
// 7 s holds a slot for a minute at most, not 17.
const maxTCPQueries = 8

// dnsHandler answers a network's VMs: names of VMs from resolve, the rest
// from the host's resolvers when forwarding is on, else REFUSED.
type dnsHandler struct {
	resolve func(name string) (netip.Addr, bool)
	// resolve6, if set, gives the IPv6 addresses of a name (AAAA).
	resolve6 func(name string) []netip.Addr
	// learn, if set, is told of each answer forwarded, before the client
	// hears it (the egress policy's names).
	learn func(client netip.Addr, qname string, answers []dns.RR)
	// remote, if set, looks a name up on the other hosts of the network's
	// segment (askPeers); fileName tells whether a name is one of a VM
	// file here, which no other host's name can take.
	remote    func(name string) (peerAnswer, bool)
	fileName  func(name string) bool
	upstreams []string // host:port
	// noForward refuses every name that is not the network's own (a host
	// network without dnsForward: its VMs must not reach names outside).
	noForward bool
	// dial opens a connection to an upstream. It exists because the proxy
	// must dial from the network namespace it was started in, which a
	// goroutine's thread is not guaranteed to be in.
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
	log  *slog.Logger

	// inFlight holds a token per query being forwarded (maxInFlight when
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

func (h *dnsHandler) init() {
	h.once.Do(func() {
		if h.inFlight == nil {
			h.inFlight = make(chan struct{}, maxInFlight)
		}
		h.idle = map[poolKey]chan *dns.Conn{}
		for _, network := range []string{"udp", "tcp"} {
			for _, up := range h.upstreams {
				h.idle[poolKey{network, up}] = make(chan *dns.Conn, cap(h.inFlight))
			}
		}
	})
}

func (h *dnsHandler) count(f func(s *nettypes.DNSStats)) {
	h.mu.Lock()
	f(&h.stats)
	h.mu.Unlock()
}

// Stats returns a copy of the counters.
func (h *dnsHandler) Stats() nettypes.DNSStats {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.stats
}

// ServeDNS implements dns.Handler.
func (h *dnsHandler) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	h.init()
	h.count(func(s *nettypes.DNSStats) { s.Queries++ })
	if len(r.Question) == 1 && r.Question[0].Qclass == dns.ClassINET {
		q := r.Question[0]
		name, inZone, ok := localName(q.Name)
		if inZone || ok {
			var ip netip.Addr
			var ip6 []netip.Addr
			found := false
			if ok {
				ip, found = h.resolve(name)
				if h.resolve6 != nil {
					ip6 = h.resolve6(name)
					found = found || len(ip6) > 0
				}
				// Across hosts: a VM file's name elsewhere wins over a
				// DHCP host name here, as a VM file's name here does.
				if h.remote != nil && (!found || h.fileName == nil || !h.fileName(name)) {
					if a, ok := h.remote(name); ok && (a.byFile || !found) {
						ip, ip6, found = a.ip, a.ip6, true
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
						Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: localTTL},
						A:   net.IP(ip.AsSlice()),
					})
				}
				if q.Qtype == dns.TypeAAAA || q.Qtype == dns.TypeANY {
					for _, a := range ip6 {
						m.Answer = append(m.Answer, &dns.AAAA{
							Hdr:  dns.RR_Header{Name: q.Name, Rrtype: dns.TypeAAAA, Class: dns.ClassINET, Ttl: localTTL},
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
	if h.noForward {
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
		h.count(func(s *nettypes.DNSStats) { s.Dropped++ })
		return
	}
	defer func() { <-h.inFlight }()
	h.forward(w, r)
}

func (h *dnsHandler) forward(w dns.ResponseWriter, r *dns.Msg) {
	network := "udp"
	if _, ok := w.LocalAddr().(*net.TCPAddr); ok {
		network = "tcp"
	}
	for _, up := range h.upstreams {
		resp, err := h.exchange(network, up, r)
		if err != nil {
			h.log.Debug("upstream resolver failed", "upstream", up, "err", err)
			continue
		}
		h.count(func(s *nettypes.DNSStats) { s.Forwarded++ })
		if h.learn != nil && len(r.Question) == 1 {
			var client netip.Addr
			switch a := w.RemoteAddr().(type) {
			case *net.UDPAddr:
				client = a.AddrPort().Addr().Unmap()
			case *net.TCPAddr:
				client = a.AddrPort().Addr().Unmap()
			}
			h.learn(client, r.Question[0].Name, resp.Answer)
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

// exchange asks upstream over an idle connection of the pool, or a new
// one. The query goes out with an id of the proxy's own, so an answer that
// arrives late on a reused UDP socket (to a query that timed out) has
// another id and is skipped by the next exchange on it.
func (h *dnsHandler) exchange(network, upstream string, r *dns.Msg) (*dns.Msg, error) {
	pool := h.idle[poolKey{network, upstream}]
	q := r.Copy()
	q.Id = dns.Id()
	c := &dns.Client{Net: network, Timeout: upstreamTimeout}
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
func (h *dnsHandler) conn(pool chan *dns.Conn, network, upstream string) (*dns.Conn, bool, error) {
	select {
	case co := <-pool:
		return co, true, nil
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), upstreamTimeout)
	defer cancel()
	nc, err := h.dial(ctx, network, upstream)
	if err != nil {
		return nil, false, err
	}
	return &dns.Conn{Conn: nc}, false, nil
}

// put returns a connection to the pool, or closes it when the pool is full.
func (h *dnsHandler) put(pool chan *dns.Conn, co *dns.Conn) {
	select {
	case pool <- co:
	default:
		co.Close()
	}
}

// closeIdle closes the pooled upstream connections.
func (h *dnsHandler) closeIdle() error {
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
		if rq.Qtype != qq.Qtype || rq.Qclass != qq.Qclass || asciiLower(rq.Name) != asciiLower(qq.Name) {
			return false
		}
	}
	return true
}

// maxUDPHandlers bounds the goroutines that serve UDP queries: maxInFlight
// may wait on upstreams, the rest keep answering the network's own names
// meanwhile. A query beyond it is dropped and counted.
const maxUDPHandlers = 2 * maxInFlight

// udpServer serves the proxy over UDP with at most maxUDPHandlers
// goroutines. (miekg/dns's Server starts one per packet, however many are
// already waiting, so its UDP loop is not used; its TCP one is, behind
// limitListener.)
type udpServer struct {
	conn    *net.UDPConn
	handler dns.Handler
	dropped func() // a query dropped: every handler busy
	slots   chan struct{}
	wg      sync.WaitGroup
	// allow, if set, is who may ask: a datagram from anyone else is
	// dropped before it takes a handler, so that strangers cannot
	// crowd out those who may.
	allow func(netip.Addr) bool
}

func newUDPServer(conn *net.UDPConn, h *dnsHandler) *udpServer {
	return &udpServer{conn: conn, handler: h, slots: make(chan struct{}, maxUDPHandlers), dropped: func() {
		h.init()
		h.count(func(st *nettypes.DNSStats) { st.Queries++; st.Dropped++ })
	}}
}

// countDropped counts a query not answered.
func (h *dnsHandler) countDropped() { h.count(func(s *nettypes.DNSStats) { s.Dropped++ }) }

// serve reads queries until the socket is closed, then waits for the
// handlers.
func (s *udpServer) serve() error {
	defer s.wg.Wait()
	buf := make([]byte, dns.MaxMsgSize)
	for {
		n, from, err := s.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		if !acceptQuery(buf[:n]) || s.allow != nil && !s.allow(from.Addr().Unmap()) {
			continue
		}
		select {
		case s.slots <- struct{}{}:
		default:
			s.dropped()
			continue
		}
		b := append([]byte(nil), buf[:n]...)
		s.wg.Add(1)
		go func() {
			defer func() { <-s.slots; s.wg.Done() }()
			r := new(dns.Msg)
			if r.Unpack(b) != nil {
				return
			}
			s.handler.ServeDNS(&udpWriter{conn: s.conn, to: from}, r)
		}()
	}
}

// close stops serve.
func (s *udpServer) close() error { return s.conn.Close() }

// acceptQuery applies queryOnly to a packet's header.
func acceptQuery(b []byte) bool {
	if len(b) < 12 {
		return false
	}
	u16 := func(i int) uint16 { return uint16(b[i])<<8 | uint16(b[i+1]) }
	dh := dns.Header{Id: u16(0), Bits: u16(2), Qdcount: u16(4), Ancount: u16(6), Nscount: u16(8), Arcount: u16(10)}
	return queryOnly(dh) == dns.MsgAccept
}

// queryOnly is the proxy's acceptance, over UDP and TCP: miekg/dns's
// default (a query, never a response, so two resolvers cannot be made to
// ping-pong; one question), and only opcode QUERY, with no answer or
// authority records: a NOTIFY, which the default lets through, would reach
// the host's resolver as the host's own (one that trusts its loopback for
// them). Anything else is ignored, not answered: a reply to junk can be
// used to amplify.
func queryOnly(dh dns.Header) dns.MsgAcceptAction {
	if a := dns.DefaultMsgAcceptFunc(dh); a != dns.MsgAccept {
		return dns.MsgIgnore
	}
	if opcode := int(dh.Bits>>11) & 0xF; opcode != dns.OpcodeQuery || dh.Ancount != 0 || dh.Nscount != 0 {
		return dns.MsgIgnore
	}
	return dns.MsgAccept
}

// udpWriter is the dns.ResponseWriter of one UDP query.
type udpWriter struct {
	conn *net.UDPConn
	to   netip.AddrPort
}

func (w *udpWriter) LocalAddr() net.Addr  { return w.conn.LocalAddr() }
func (w *udpWriter) RemoteAddr() net.Addr { return net.UDPAddrFromAddrPort(w.to) }
func (w *udpWriter) WriteMsg(m *dns.Msg) error {
	// Sized as miekg/dns's server leaves it: local answers are small, and
	// an upstream's answer was sized for the client's own query.
	b, err := m.Pack()
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}
func (w *udpWriter) Write(b []byte) (int, error) { return w.conn.WriteToUDPAddrPort(b, w.to) }
func (w *udpWriter) Close() error                { return nil }
func (w *udpWriter) TsigStatus() error           { return nil }
func (w *udpWriter) TsigTimersOnly(bool)         {}
func (w *udpWriter) Hijack()                     {}

// limitListener accepts at most maxTCPConns connections at a time; one
// beyond is closed at once and counted as dropped.
type limitListener struct {
	net.Listener
	slots chan struct{}
	h     *dnsHandler
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			return &limitConn{Conn: c, release: func() { <-l.slots }}, nil
		default:
			c.Close()
			l.h.count(func(s *nettypes.DNSStats) { s.Dropped++ })
		}
	}
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
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
