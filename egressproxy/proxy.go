package egressproxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// Config is what a Proxy asks of its owner.
type Config struct {
	// Allow says whether src may reach dst by naming name (lower case,
	// without a trailing dot; "" when the connection names none).
	Allow func(src, dst netip.AddrPort, name string) bool
	// Dial connects to the original destination (in the network's
	// namespace).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Denied is told of each connection refused: the name it asked for
	// ("" if none) and why, in a few words.
	Denied func(src, dst netip.AddrPort, name, why string)
	// OriginalDst reads a redirected connection's destination; nil for
	// the kernel's (SO_ORIGINAL_DST).
	OriginalDst func(c *net.TCPConn) (netip.AddrPort, error)
	Log         *slog.Logger
}

// Bounds: a guest that opens connections and sends nothing holds at most
// MaxPerSource of the proxy's MaxConns, each at most HelloWait.
const (
	MaxConns     = 4096
	MaxPerSource = 256
	// HelloWait is how long a connection may take to send its
	// ClientHello or request's head.
	HelloWait = 30 * time.Second
	// maxHello bounds what is read before the verdict: a ClientHello
	// (at most 64 KiB in records of 16 KiB) or a request's head.
	maxHello = 64<<10 + 4*(5+256)
	maxHead  = 64 << 10
)

// Proxy is the transparent proxy of one network.
type Proxy struct {
	cfg Config

	mu     sync.Mutex
	total  int
	per    map[netip.Addr]int
	closed bool
	lns    []net.Listener
	conns  map[net.Conn]struct{} // both sides of each connection
	wg     sync.WaitGroup
}

// New returns a proxy that serves listeners given to Serve.
func New(cfg Config) *Proxy {
	if cfg.OriginalDst == nil {
		cfg.OriginalDst = originalDst
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Proxy{cfg: cfg, per: map[netip.Addr]int{}, conns: map[net.Conn]struct{}{}}
}

// Serve accepts ln's connections until Close.
func (p *Proxy) Serve(ln net.Listener) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		ln.Close()
		return net.ErrClosed
	}
	p.lns = append(p.lns, ln)
	p.mu.Unlock()
	for {
		c, err := ln.Accept()
		if err != nil {
			if p.isClosed() {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		tc, ok := c.(*net.TCPConn)
		if !ok {
			c.Close()
			continue
		}
		src := addrPortOf(tc.RemoteAddr())
		if !p.admit(src.Addr()) {
			p.cfg.Denied(src, netip.AddrPort{}, "", "too many connections at once")
			reset(tc)
			continue
		}
		p.wg.Go(func() {
			defer p.release(src.Addr())
			if !p.track(tc) {
				return
			}
			defer p.untrack(tc)
			p.handle(tc, src)
		})
	}
}

// Close stops the listeners, ends every connection (the proxy is in the
// path: its connections end with it) and waits for their goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	lns := p.lns
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	for _, ln := range lns {
		ln.Close()
	}
	p.wg.Wait()
	return nil
}

// track keeps c to close with the proxy; false if it is closed already.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

func (p *Proxy) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// admit counts a connection from src in, if the bounds allow it.
func (p *Proxy) admit(src netip.Addr) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.total >= MaxConns || p.per[src] >= MaxPerSource {
		return false
	}
	p.total++
	p.per[src]++
	return true
}

func (p *Proxy) release(src netip.Addr) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.total--
	if p.per[src]--; p.per[src] <= 0 {
		delete(p.per, src)
	}
}

// handle checks one connection and, if it passes, splices it to its
// destination.
func (p *Proxy) handle(c *net.TCPConn, src netip.AddrPort) {
	defer c.Close()
	dst, err := p.cfg.OriginalDst(c)
	if err != nil || dst == addrPortOf(c.LocalAddr()) {
		// Not redirected: sent to the proxy's own port.
		p.cfg.Denied(src, dst, "", "not a redirected connection")
		reset(c)
		return
	}
	c.SetReadDeadline(time.Now().Add(HelloWait))
	var first [1]byte
	if _, err := io.ReadFull(c, first[:]); err != nil {
		return // closed before a byte: nothing was sent anywhere
	}
	in := &recorder{r: io.MultiReader(strings.NewReader(string(first[:])), c), max: maxHello}
	if first[0] == recordTypeHandshake {
		in.keep = true
		p.tls(c, in, src, dst)
		return
	}
	p.http(c, in, src, dst)
}

// recordTypeHandshake starts every TLS connection's first record.
const recordTypeHandshake = 0x16

// tls reads the ClientHello, checks its name, and splices.
func (p *Proxy) tls(c *net.TCPConn, in *recorder, src, dst netip.AddrPort) {
	hello, err := readClientHello(in)
	name := ""
	why := ""
	switch {
	case err != nil:
		why = "not a TLS ClientHello: " + err.Error()
	case hello.ech:
		why = "an encrypted ClientHello (ECH) hides the name"
		name = hello.name
	default:
		name = hello.name
		if !p.cfg.Allow(src, dst, name) {
			why = "TLS names " + quoteName(name) + ", which the policy does not allow"
		}
	}
	if why != "" {
		p.cfg.Denied(src, dst, name, why)
		c.Write(tlsAccessDenied)
		return
	}
	up := p.dial(c, dst)
	if up == nil {
		return
	}
	defer up.Close()
	c.SetReadDeadline(time.Time{})
	if _, err := up.Write(in.buf); err != nil {
		return
	}
	splice(c, up, c)
}

// tlsAccessDenied is a TLS alert record, fatal, access_denied.
var tlsAccessDenied = []byte{0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 49}

// http reads each request, checks its Host, and writes it on: the
// responses go back as the server sent them.
func (p *Proxy) http(c *net.TCPConn, in *recorder, src, dst netip.AddrPort) {
	in.max = maxHead
	br := bufio.NewReader(in)
	var up net.Conn
	done := make(chan struct{})
	defer func() {
		if up != nil {
			up.Close()
			<-done
		}
	}()
	for n := 0; ; n++ {
		in.n = 0 // each head within maxHead
		req, err := http.ReadRequest(br)
		if err != nil {
			if n == 0 && !errors.Is(err, io.EOF) {
				p.cfg.Denied(src, dst, "", "neither TLS nor an HTTP/1 request")
				c.Write([]byte("HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"))
			}
			return
		}
		name := hostName(req.Host)
		why := ""
		switch {
		case req.Method == "PRI" || req.Method == http.MethodConnect:
			why = req.Method + " names its destinations past the proxy"
		case !p.cfg.Allow(src, dst, name):
			why = "HTTP names " + quoteName(name) + ", which the policy does not allow"
		}
		if why != "" {
			p.cfg.Denied(src, dst, name, why)
			if n == 0 {
				c.Write([]byte("HTTP/1.1 403 Forbidden\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: " +
					fmt.Sprint(len(forbidden)) + "\r\n\r\n" + forbidden))
			}
			reset(c)
			return
		}
		if up == nil {
			if up = p.dial(c, dst); up == nil {
				return
			}
			c.SetReadDeadline(time.Time{})
			go func() {
				defer close(done)
				io.Copy(c, up.(tracked).Conn) // (spliced by the kernel)
				c.CloseWrite()
			}()
		}
		in.max = -1 // a body may be any size
		if _, ok := req.Header["User-Agent"]; !ok {
			req.Header["User-Agent"] = []string{""} // Write adds none
		}
		if err := req.Write(up); err != nil {
			return
		}
		in.max = maxHead
		if req.Header.Get("Upgrade") != "" {
			// A protocol switch (a WebSocket): what follows is no
			// longer HTTP; the Host it was opened for stands.
			in.max = -1
			io.Copy(up, br)
			closeWrite(up)
			return
		}
	}
}

const forbidden = "vmnetctl: the egress policy does not allow this host\n"

// dial connects to dst for c; nil (c reset) if it cannot.
func (p *Proxy) dial(c *net.TCPConn, dst netip.AddrPort) net.Conn {
	up, err := p.cfg.Dial(context.Background(), "tcp", dst.String())
	if err != nil {
		reset(c)
		return nil
	}
	if !p.track(up) {
		return nil
	}
	return tracked{up, p}
}

// tracked is an upstream connection that leaves the proxy's set when
// closed.
type tracked struct {
	net.Conn
	p *Proxy
}

func (t tracked) Close() error {
	t.p.untrack(t.Conn)
	return t.Conn.Close()
}

func (t tracked) CloseWrite() error {
	closeWrite(t.Conn)
	return nil
}

// splice copies both ways until both sides are done: what from reads
// goes to up and the other way, each side's end of stream passed on.
func splice(c *net.TCPConn, up net.Conn, from io.Reader) {
	if t, ok := up.(tracked); ok {
		up = t.Conn // the TCP socket itself: the kernel splices it
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		io.Copy(c, up)
		c.CloseWrite()
	}()
	io.Copy(up, from)
	closeWrite(up)
	<-done
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
}

// reset closes c with a reset, as a refused connection would be.
func reset(c *net.TCPConn) {
	c.SetLinger(0)
	c.Close()
}

// hostName is a Host's name: lower case, without its port, brackets or
// trailing dot.
func hostName(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	return strings.ToLower(host)
}

func quoteName(name string) string {
	if name == "" {
		return "no name"
	}
	return fmt.Sprintf("%q", name)
}

func addrPortOf(a net.Addr) netip.AddrPort {
	if ta, ok := a.(*net.TCPAddr); ok {
		ap := ta.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return netip.AddrPort{}
}

// recorder reads through r at most max bytes (-1: any) since n was last
// zeroed, and keeps what it read if keep.
type recorder struct {
	r    io.Reader
	keep bool
	buf  []byte
	max  int
	n    int
}

var errTooLong = errors.New("longer than the proxy reads before its verdict")

func (r *recorder) Read(b []byte) (int, error) {
	if r.max >= 0 {
		if r.n >= r.max {
			return 0, errTooLong
		}
		b = b[:min(len(b), r.max-r.n)]
	}
	n, err := r.r.Read(b)
	r.n += n
	if r.keep {
		r.buf = append(r.buf, b[:n]...)
	}
	return n, err
}
