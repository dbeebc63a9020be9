package dnsproxy

import (
	"errors"
	"net"
	"net/netip"
	"sync"

	"github.com/miekg/dns"
	"github.com/vmnetctl/vmnetctl/nettypes"
)

// Server is one of a proxy's servers: Serve until Stop.
type Server struct {
	Serve func() error
	Stop  func() error
}

// Servers are p's servers on a UDP socket and a TCP listener, each bounded
// (maxUDPHandlers goroutines, MaxTCPConns connections of MaxTCPQueries
// queries) with what goes beyond counted as dropped.
func (h *Proxy) Servers(pc *net.UDPConn, ln net.Listener) []Server {
	udp := NewUDPServer(pc, h, maxUDPHandlers, func() {
		h.init()
		h.count(func(st *nettypes.DNSStats) { st.Queries++; st.Dropped++ })
	}, nil)
	ln = &limitListener{Listener: ln, slots: make(chan struct{}, MaxTCPConns), h: h}
	tcp := &dns.Server{Listener: ln, Handler: h, MsgAcceptFunc: QueryOnly, MaxTCPQueries: MaxTCPQueries}
	return []Server{{udp.Serve, udp.Close}, {tcp.ActivateAndServe, tcp.Shutdown}}
}

// maxUDPHandlers bounds the goroutines that serve UDP queries: MaxInFlight
// may wait on upstreams, the rest keep answering the network's own names
// meanwhile. A query beyond it is dropped and counted.
const maxUDPHandlers = 2 * MaxInFlight

// UDPServer serves DNS over UDP with a bounded number of goroutines.
// (miekg/dns's Server starts one per packet, however many are already
// waiting, so its UDP loop is not used; its TCP one is, behind
// limitListener.)
type UDPServer struct {
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

// NewUDPServer serves handler on conn with at most handlers goroutines;
// dropped, if set, is told of each query dropped since all were busy, and
// allow, if set, is who may ask: a datagram from anyone else is dropped
// before it takes a handler, so that strangers cannot crowd out those who
// may.
func NewUDPServer(conn *net.UDPConn, handler dns.Handler, handlers int, dropped func(), allow func(netip.Addr) bool) *UDPServer {
	if dropped == nil {
		dropped = func() {}
	}
	return &UDPServer{conn: conn, handler: handler, slots: make(chan struct{}, handlers), dropped: dropped, allow: allow}
}

// Serve reads queries until the socket is closed, then waits for the
// handlers.
func (s *UDPServer) Serve() error {
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

// Close stops Serve.
func (s *UDPServer) Close() error { return s.conn.Close() }

// acceptQuery applies QueryOnly to a packet's header.
func acceptQuery(b []byte) bool {
	if len(b) < 12 {
		return false
	}
	u16 := func(i int) uint16 { return uint16(b[i])<<8 | uint16(b[i+1]) }
	dh := dns.Header{Id: u16(0), Bits: u16(2), Qdcount: u16(4), Ancount: u16(6), Nscount: u16(8), Arcount: u16(10)}
	return QueryOnly(dh) == dns.MsgAccept
}

// QueryOnly is the proxy's acceptance, over UDP and TCP: miekg/dns's
// default (a query, never a response, so two resolvers cannot be made to
// ping-pong; one question), and only opcode QUERY, with no answer or
// authority records: a NOTIFY, which the default lets through, would reach
// the host's resolver as the host's own (one that trusts its loopback for
// them). Anything else is ignored, not answered: a reply to junk can be
// used to amplify.
func QueryOnly(dh dns.Header) dns.MsgAcceptAction {
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

// limitListener accepts at most MaxTCPConns connections at a time; one
// beyond is closed at once and counted as dropped.
type limitListener struct {
	net.Listener
	slots chan struct{}
	h     *Proxy
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
			l.h.CountDropped()
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
