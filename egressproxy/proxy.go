package egressproxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/net/http/httpguts"
)

// Config is what a Proxy asks of its owner.
type Config struct {
	// Allow says whether src may reach dst by naming name (a DNS name,
	// lower case, without a trailing dot; "" when the connection names
	// none).
	Allow func(src, dst netip.AddrPort, name string) bool
	// Dial connects to the original destination (in the network's
	// namespace); ctx ends with the proxy, or after DialWait.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Denied is told of each connection refused: the name it asked for
	// ("" if none) and why, in a few words.
	Denied func(src, dst netip.AddrPort, name, why string)
	// Client names the VM that sends from src, for the bound on each
	// VM's connections whatever addresses it sends from; nil, or "",
	// for the address itself.
	Client func(src netip.Addr) string
	// CheckDst says why the proxy must not dial a destination, whatever
	// it names ("" if it may); nil for none.
	CheckDst func(dst netip.Addr) string
	// OuterECH says whether the policy of the VM at src judges a
	// ClientHello that carries an encrypted one (ECH) by its outer name
	// (`ech: outer`) rather than refuse it; nil: refuse.
	OuterECH func(src netip.AddrPort) bool
	// OriginalDst reads a redirected connection's destination; nil for
	// the kernel's (SO_ORIGINAL_DST).
	OriginalDst func(c *net.TCPConn) (netip.AddrPort, error)
	Log         *slog.Logger
}

// Bounds: a guest that opens connections and sends nothing holds at most
// MaxPerClient of the proxy's MaxConns, each at most HelloWait, and each
// at most maxHello of memory until its verdict.
const (
	MaxConns     = 2048
	MaxPerClient = 256
	// HelloWait is how long a connection may take to send its
	// ClientHello or a request's head, and how long a kept-alive HTTP
	// connection may wait for its next request.
	HelloWait = 30 * time.Second
	// DialWait bounds a dial to the destination (the kernel's own SYN
	// retries take two minutes); maxDials the dials at once, and
	// MaxDialsPerClient a client's share of them: a guest that dials
	// destinations that never answer holds its own share, never the
	// network's (its next connection is reset while its share is held).
	DialWait          = 30 * time.Second
	maxDials          = 256
	MaxDialsPerClient = 16
	// maxHello bounds what is read before a TLS verdict: a ClientHello,
	// its extensions and post-quantum key shares included, is a few
	// KiB; maxHead a request's head.
	maxHello = 32 << 10
	maxHead  = 64 << 10
)

// Proxy is the transparent proxy of one network.
type Proxy struct {
	cfg    Config
	ctx    context.Context // ends with Close: dials and waits
	cancel context.CancelFunc
	dials  chan struct{}

	mu      sync.Mutex
	total   int
	per     map[string]int
	dialing map[string]int // by client: its dials that have not ended
	closed  bool
	lns     []net.Listener
	conns   map[net.Conn]struct{} // both sides of each connection
	wg      sync.WaitGroup
}

// New returns a proxy that serves listeners given to Serve.
func New(cfg Config) *Proxy {
	if cfg.OriginalDst == nil {
		cfg.OriginalDst = originalDst
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Proxy{cfg: cfg, ctx: ctx, cancel: cancel, dials: make(chan struct{}, maxDials),
		per: map[string]int{}, dialing: map[string]int{}, conns: map[net.Conn]struct{}{}}
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
	var delay time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if p.isClosed() {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// Out of descriptors, or the like: wait and try again, as
			// net/http's server does.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			p.cfg.Log.Warn("the name check cannot accept a connection; trying again", "err", err, "in", delay)
			select {
			case <-time.After(delay):
			case <-p.ctx.Done():
				return nil
			}
			continue
		}
		delay = 0
		tc, ok := c.(*net.TCPConn)
		if !ok {
			c.Close()
			continue
		}
		src := addrPortOf(tc.RemoteAddr())
		key := src.Addr().String()
		if p.cfg.Client != nil {
			if k := p.cfg.Client(src.Addr()); k != "" {
				key = k
			}
		}
		if !p.admit(key) {
			p.cfg.Denied(src, netip.AddrPort{}, "", "too many connections at once")
			reset(tc)
			continue
		}
		go func() {
			defer p.wg.Done()
			defer p.release(key)
			if !p.track(tc) {
				return
			}
			defer p.untrack(tc)
			p.handle(tc, src, key)
		}()
	}
}

// Close stops the listeners, ends every connection (the proxy is in the
// path: its connections end with it) and every dial, and waits for their
// goroutines.
func (p *Proxy) Close() error {
	p.cancel()
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

// admit counts a connection of client in (and in p.wg), if the bounds
// allow it and the proxy is not closed.
func (p *Proxy) admit(client string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.total >= MaxConns || p.per[client] >= MaxPerClient {
		return false
	}
	p.total++
	p.per[client]++
	p.wg.Add(1) // under mu: never after Close's Wait began
	return true
}

func (p *Proxy) release(client string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.total--
	if p.per[client]--; p.per[client] <= 0 {
		delete(p.per, client)
	}
}

// handle checks one connection and, if it passes, splices it to its
// destination.
func (p *Proxy) handle(c *net.TCPConn, src netip.AddrPort, client string) {
	defer c.Close()
	dst, err := p.cfg.OriginalDst(c)
	if err != nil || dst == addrPortOf(c.LocalAddr()) {
		// Not redirected: sent to the proxy's own port.
		p.cfg.Denied(src, dst, "", "not a redirected connection")
		reset(c)
		return
	}
	if why := p.cfg.checkDst(dst); why != "" {
		p.cfg.Denied(src, dst, "", why)
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
		p.tls(c, client, in, src, dst)
		return
	}
	p.http(c, client, in, src, dst)
}

// recordTypeHandshake starts every TLS connection's first record.
const recordTypeHandshake = 0x16

// tls reads the ClientHello, checks its name, and splices.
func (p *Proxy) tls(c *net.TCPConn, client string, in *recorder, src, dst netip.AddrPort) {
	hello, err := readClientHello(in)
	name, why := p.cfg.judgeHello(hello, err, src, dst)
	if why != "" {
		p.cfg.Denied(src, dst, name, why)
		c.Write(tlsAccessDenied)
		return
	}
	up := p.dial(c, client, dst)
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

// judgeHello is the verdict on a connection from src to dst whose
// ClientHello read as hello, or failed to with err: the name it asks for
// ("" if none, or none read), and why it is refused ("" if it is not).
func (cfg *Config) judgeHello(hello clientHello, err error, src, dst netip.AddrPort) (name, why string) {
	switch {
	case err != nil:
		return "", "not a TLS ClientHello: " + err.Error()
	case hello.ech && (cfg.OuterECH == nil || !cfg.OuterECH(src)):
		return hello.name, "an encrypted ClientHello (ECH) hides the name"
	case hello.name != "" && !ValidName(hello.name):
		return "", fmt.Sprintf("TLS names %q, which is no DNS name", hello.name)
	case !cfg.Allow(src, dst, hello.name):
		return hello.name, "TLS names " + quoteName(hello.name) + ", which the policy does not allow"
	}
	return hello.name, ""
}

// checkDst is why the proxy must not reach dst (CheckDst), "" if it may.
func (cfg *Config) checkDst(dst netip.AddrPort) string {
	if cfg.CheckDst != nil {
		if why := cfg.CheckDst(dst.Addr()); why != "" {
			return "the destination is " + why
		}
	}
	return ""
}

// JudgeTLS judges the first bytes a connection from src to dst sent, as
// the proxy judges a redirected one, for a check that sees the bytes
// without ending the connection (one on netfilter's queue): more is true
// while they hold no whole ClientHello yet (its records so far are
// well-formed and within the proxy's bound); then name is what it asks
// for and why says why it is refused ("" if it is not): by its name, or
// by its destination (CheckDst), as the proxy refuses to dial it. Bytes
// that are no TLS handshake, or a ClientHello past the bound, are
// refused at once.
func (cfg *Config) JudgeTLS(first []byte, src, dst netip.AddrPort) (more bool, name, why string) {
	n, err := helloLen(first)
	if n == 0 && err == nil {
		return true, "", ""
	}
	var hello clientHello
	if err == nil {
		hello, err = readClientHello(bytes.NewReader(first[:n]))
	}
	if name, why = cfg.judgeHello(hello, err, src, dst); why == "" {
		why = cfg.checkDst(dst)
	}
	return false, name, why
}

// tlsAccessDenied is a TLS alert record, fatal, access_denied.
var tlsAccessDenied = []byte{0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 49}

// http reads each request, checks its Host, writes it on and writes the
// answer back, one at a time: a request is read only once the one before
// it is answered, so that none passes unchecked, not even after an
// upgrade the server refused.
func (p *Proxy) http(c *net.TCPConn, client string, in *recorder, src, dst netip.AddrPort) {
	br := bufio.NewReader(in)
	var up net.Conn
	var ubr *bufio.Reader
	var uin *recorder // the server's side, bounded while a head is read
	defer func() {
		if up != nil {
			up.Close()
		}
	}()
	for n := 0; ; n++ {
		c.SetReadDeadline(time.Now().Add(HelloWait)) // the head, and the wait for it
		in.n, in.max = 0, maxHead
		req, err := http.ReadRequest(br)
		if err != nil {
			var ne net.Error
			if errors.Is(err, io.EOF) || errors.As(err, &ne) && ne.Timeout() || errors.Is(err, net.ErrClosed) {
				if n == 0 {
					p.cfg.Denied(src, dst, "", "no request")
				}
				return // the client is done, or went quiet
			}
			what := "neither TLS nor an HTTP/1 request"
			if n > 0 {
				what = "a request that is not HTTP/1"
			}
			p.cfg.Denied(src, dst, "", what)
			c.Write([]byte("HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"))
			return
		}
		name, why := requestName(req)
		if why == "" && !p.cfg.Allow(src, dst, name) {
			why = "HTTP names " + quoteName(name) + ", which the policy does not allow"
		}
		if why != "" {
			p.cfg.Denied(src, dst, name, why)
			c.Write([]byte("HTTP/1.1 403 Forbidden\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: " +
				fmt.Sprint(len(forbidden)) + "\r\n\r\n" + forbidden))
			return
		}
		c.SetReadDeadline(time.Time{}) // a body may take its time
		websocket := isWebSocket(req)
		if !websocket {
			withoutUpgrade(req)
		}
		req.Header.Del("Http2-Settings") // (no h2c, however asked)
		if httpguts.HeaderValuesContainsToken(req.Header["Expect"], "100-continue") {
			// Answered here: the request is written on whole, its body
			// read first.
			req.Header.Del("Expect")
			if req.ProtoAtLeast(1, 1) {
				c.Write([]byte("HTTP/1.1 100 Continue\r\n\r\n"))
			}
		}
		if up == nil {
			if up = p.dial(c, client, dst); up == nil {
				return
			}
			uin = &recorder{r: up, max: -1}
			ubr = bufio.NewReaderSize(uin, 64<<10)
		}
		in.max = -1 // a body may be any size
		if _, ok := req.Header["User-Agent"]; !ok {
			req.Header["User-Agent"] = []string{""} // Write adds none
		}
		if err := writeOn(req.Write, bodyWriter(&req.Body, req.ContentLength, req.TransferEncoding, br, c, up, uploadWake)); err != nil {
			return
		}
		resp, err := p.readResponse(c, ubr, uin, req)
		if err != nil {
			return
		}
		if resp.StatusCode == http.StatusSwitchingProtocols && (!websocket || !isWebSocketHeader(resp.Header)) {
			return // a switch to anything but the WebSocket asked for
		}
		if websocket && resp.StatusCode == http.StatusSwitchingProtocols {
			// The server switched: what follows is WebSocket's, for the
			// Host checked. Whatever either side sent past the heads
			// goes first.
			if resp.Write(c) != nil || writeBuffered(c, ubr) != nil || writeBuffered(up, br) != nil {
				return
			}
			splice(c, up, c)
			return
		}
		if !req.ProtoAtLeast(1, 1) {
			// An HTTP/1.0 client reads no chunks: the answer goes to it
			// as 1.0, its body until the connection ends if its length
			// is not known.
			resp.Proto, resp.ProtoMajor, resp.ProtoMinor = "HTTP/1.0", 1, 0
			resp.TransferEncoding = nil
			resp.Close = resp.Close || resp.ContentLength < 0 || !httpguts.HeaderValuesContainsToken(req.Header["Connection"], "keep-alive")
		}
		err = writeOn(resp.Write, bodyWriter(&resp.Body, resp.ContentLength, resp.TransferEncoding, ubr, up, c, 0))
		resp.Body.Close()
		if err != nil || resp.Close || req.Close {
			return
		}
	}
}

// readResponse reads the server's answer to req, its head at most
// maxResponseHead: the interim answers (1xx but 101: 100 Continue, 103
// Early Hints) are passed to c as they come, and the final one returned.
func (p *Proxy) readResponse(c *net.TCPConn, ubr *bufio.Reader, uin *recorder, req *http.Request) (*http.Response, error) {
	for {
		uin.n, uin.max = 0, maxResponseHead
		resp, err := http.ReadResponse(ubr, req)
		uin.max = -1 // a body may be any size
		if err != nil {
			return nil, err
		}
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			return resp, nil
		}
		if req.ProtoAtLeast(1, 1) {
			var b bytes.Buffer
			fmt.Fprintf(&b, "HTTP/1.1 %s\r\n", resp.Status)
			resp.Header.Write(&b)
			b.WriteString("\r\n")
			if _, err := c.Write(b.Bytes()); err != nil {
				return nil, err
			}
		}
	}
}

// maxResponseHead bounds what is read of the server's side for an
// answer's head: the head and what the reads bring of its body with it.
const maxResponseHead = 4 * maxHead

// uploadWake is how many bytes of a request's body wake the proxy
// (copyBody).
const uploadWake = 64 << 10

// bodyWriter is where a request or an answer read from src through br
// is written, to dst: a body of known length (n, not chunked: te empty)
// between two TCP sockets goes past the bytes br holds of it, in large
// reads and writes of the sockets themselves (copyBody), with wake as
// copyBody's; *body becomes the reader of it. Anything else is written
// to dst as net/http writes it.
func bodyWriter(body *io.ReadCloser, n int64, te []string, br *bufio.Reader, src, dst net.Conn, wake int) io.Writer {
	from, ok1 := tcpOf(src)
	to, ok2 := tcpOf(dst)
	if !ok1 || !ok2 || n <= 0 || len(te) > 0 || *body == nil || *body == http.NoBody {
		return dst
	}
	*body = &knownBody{br: br, conn: from, left: n, wake: wake}
	return &headFirst{conn: to}
}

// tcpOf is c's TCP socket, if it is one.
func tcpOf(c net.Conn) (*net.TCPConn, bool) {
	tc, ok := untracked(c).(*net.TCPConn)
	return tc, ok
}

// knownBody is a body of known length, the first of whose bytes br may
// hold: those are read from br, the rest from the socket itself.
type knownBody struct {
	br    *bufio.Reader
	conn  *net.TCPConn
	left  int64
	wake  int  // copyBody's
	moved bool // headFirst.ReadFrom took it: no read of it after
}

func (b *knownBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, io.EOF
	}
	if b.moved {
		// (net/http drains a body after its copy: a copy that came
		// short ended with an error, and nothing more is read.)
		return 0, io.ErrUnexpectedEOF
	}
	p = p[:min(int64(len(p)), b.left)]
	var n int
	var err error
	if b.br.Buffered() > 0 {
		n, err = b.br.Read(p) // from its buffer alone
	} else {
		n, err = b.conn.Read(p)
	}
	b.left -= int64(n)
	if err == io.EOF && b.left > 0 {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

// Close leaves what is not read: the connection ends with it.
func (b *knownBody) Close() error { return nil }

// headFirst writes a head, which net/http writes a field at a time, in
// one write with the first of its body, and moves a knownBody with
// copyBody (net/http copies a body of known length to its writer's
// ReadFrom as an io.LimitedReader of it).
type headFirst struct {
	conn *net.TCPConn
	head []byte
}

func (w *headFirst) Write(p []byte) (int, error) {
	w.head = append(w.head, p...)
	return len(p), nil
}

// WriteByte makes it an io.ByteWriter, which net/http takes as buffered.
func (w *headFirst) WriteByte(c byte) error {
	w.head = append(w.head, c)
	return nil
}

func (w *headFirst) ReadFrom(r io.Reader) (int64, error) {
	lr, ok := r.(*io.LimitedReader)
	var b *knownBody
	if ok {
		b, ok = lr.R.(*knownBody)
	}
	if !ok || b.moved {
		if err := w.flush(); err != nil {
			return 0, err
		}
		return io.Copy(writerOnly{w.conn}, r)
	}
	b.moved = true
	// The head and what br holds of the body, in one write.
	k := min(int64(b.br.Buffered()), lr.N, b.left)
	held, _ := b.br.Peek(int(k))
	w.head = append(w.head, held...)
	b.br.Discard(int(k))
	lr.N -= k
	b.left -= k
	if err := w.flush(); err != nil {
		return k, err
	}
	want := min(lr.N, b.left)
	m, err := copyBody(w.conn, b.conn, want, b.wake)
	lr.N -= m
	b.left -= m
	if err == nil && m < want {
		err = io.ErrUnexpectedEOF
	}
	return k + m, err
}

// copyBody copies n bytes from src to dst, in reads of up to
// copyBufSize, each into a pooled buffer taken only once bytes are there
// (a connection that waits holds none). With wake > 0, src's reader is
// woken only once wake bytes wait (SO_RCVLOWAT), not for each segment
// that comes, but for the last wake bytes: on a machine where a wakeup
// costs more than the copy, an upload's segments, small as the VM's
// MTU, made the proxy cost more than the rest of the path. While wake
// bytes or more are still to come, they come (or the stream ends, or the
// receive window closes, which wake the reader too); bytes that came
// wait at most heldWait for the rest (a slow sender's, or one that waits
// for the server halfway): then what is there is read. The last wake
// bytes are read as they come.
//
// Not splice(2): it stops at TCP urgent data, where read(2) skips the
// urgent byte, and a guest that marks a byte urgent in a body would
// have the proxy and the server disagree on where the body ends (a
// review's test smuggled a request for another name that way), or hold
// the copy at the mark for good.
func copyBody(dst, src *net.TCPConn, n int64, wake int) (int64, error) {
	rc, err := src.SyscallConn()
	if err != nil {
		return 0, err
	}
	marked := false
	unmark := func() {
		setRcvLowat(src, 1)
		src.SetReadDeadline(time.Time{})
		marked = false
	}
	defer func() {
		if marked {
			unmark()
		}
	}()
	var done int64
	for done < n {
		left := n - done
		switch want := wake > 0 && left > int64(wake); {
		case want && !marked:
			marked = setRcvLowat(src, wake) == nil
		case !want && marked:
			unmark()
		}
		if marked {
			src.SetReadDeadline(time.Now().Add(heldWait))
		}
		k, err := copyRead(rc, dst, min(left, copyBufSize))
		if marked && errors.Is(err, os.ErrDeadlineExceeded) {
			// Fewer than wake bytes came in heldWait: what is there
			// goes on (or the next to come); the mark is set again.
			unmark()
			k, err = copyRead(rc, dst, min(left, copyBufSize))
		}
		done += int64(k)
		if err == io.EOF {
			return done, nil // short: the caller says so
		}
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// heldWait is how long bytes of an upload wait under copyBody's mark for
// more to come.
const heldWait = 200 * time.Millisecond

// copyRead reads up to max bytes from rc, once some are there, into a
// pooled buffer, and writes them to dst: how many it wrote, io.EOF at
// the end of the stream.
func copyRead(rc syscall.RawConn, dst io.Writer, max int64) (int, error) {
	var bp *[]byte
	var k int
	var rerr error
	err := rc.Read(func(fd uintptr) bool {
		b := copyBufs.Get().(*[]byte)
		for {
			k, rerr = syscall.Read(int(fd), (*b)[:max])
			if rerr != syscall.EINTR {
				break
			}
		}
		if rerr == syscall.EAGAIN {
			copyBufs.Put(b)
			return false // wait for bytes
		}
		bp = b
		return true
	})
	if bp != nil {
		defer copyBufs.Put(bp)
	}
	switch {
	case err != nil:
		return 0, err
	case rerr != nil:
		return 0, os.NewSyscallError("read", rerr)
	case k == 0:
		return 0, io.EOF
	}
	if _, err := dst.Write((*bp)[:k]); err != nil {
		return 0, err
	}
	return k, nil
}

// copyBufSize is what one read of a body takes at most: copyBody's wake.
const copyBufSize = 64 << 10

var copyBufs = sync.Pool{New: func() any { b := make([]byte, copyBufSize); return &b }}

// writerOnly hides a writer's ReadFrom from io.Copy.
type writerOnly struct{ io.Writer }

// writeOn writes with write to w, and then what w holds.
func writeOn(write func(io.Writer) error, w io.Writer) error {
	if err := write(w); err != nil {
		return err
	}
	if h, ok := w.(*headFirst); ok {
		return h.flush()
	}
	return nil
}

// flush writes what is held.
func (w *headFirst) flush() error {
	if len(w.head) == 0 {
		return nil
	}
	_, err := w.conn.Write(w.head)
	w.head = w.head[:0]
	return err
}

// writeBuffered writes what r holds buffered to w.
func writeBuffered(w io.Writer, r *bufio.Reader) error {
	b, _ := r.Peek(r.Buffered())
	_, err := w.Write(b)
	return err
}

// requestName is the name a request asks for (its Host, or its absolute
// URI's host: what Write sends as Host), "" for an address; or why it is
// refused.
func requestName(req *http.Request) (name, why string) {
	if req.Method == "PRI" || req.Method == http.MethodConnect {
		return "", req.Method + " names its destinations past the proxy"
	}
	host := req.Host
	if h, port, err := net.SplitHostPort(host); err == nil {
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return "", fmt.Sprintf("HTTP names %q, whose port is no port", req.Host)
		}
		host = h
	}
	host = strings.TrimSuffix(host, ".")
	if _, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return "", ""
	}
	if !ValidName(host) {
		return "", fmt.Sprintf("HTTP names %q, which is no DNS name", req.Host)
	}
	return strings.ToLower(host), ""
}

// ValidName reports whether name is a DNS host name as a policy lists
// them: labels of ASCII letters, digits, hyphens and underscores, 1 to 63
// bytes each, at most 253 in all.
func ValidName(name string) bool {
	if name == "" || len(name) > 253 {
		return false
	}
	for label := range strings.SplitSeq(name, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// isWebSocket reports whether req asks to switch to WebSocket and to
// nothing else, the one upgrade passed (h2c's would carry requests the
// proxy cannot read).
func isWebSocket(req *http.Request) bool {
	return isWebSocketHeader(req.Header) && httpguts.HeaderValuesContainsToken(req.Header["Connection"], "upgrade")
}

// isWebSocketHeader reports whether h's Upgrade is WebSocket alone: one
// line, one token.
func isWebSocketHeader(h http.Header) bool {
	u := h["Upgrade"]
	return len(u) == 1 && strings.EqualFold(strings.TrimSpace(u[0]), "websocket")
}

// withoutUpgrade takes any other upgrade out of req: the server answers
// in HTTP/1.1.
func withoutUpgrade(req *http.Request) {
	if _, ok := req.Header["Upgrade"]; !ok {
		return
	}
	req.Header.Del("Upgrade")
	req.Header.Del("Http2-Settings")
	var keep []string
	for _, v := range req.Header["Connection"] {
		for tok := range strings.SplitSeq(v, ",") {
			if tok = strings.TrimSpace(tok); tok != "" && !strings.EqualFold(tok, "upgrade") && !strings.EqualFold(tok, "http2-settings") {
				keep = append(keep, tok)
			}
		}
	}
	req.Header.Del("Connection")
	if len(keep) > 0 {
		req.Header.Set("Connection", strings.Join(keep, ", "))
	}
}

const forbidden = "vmnetctl: the egress policy does not allow this host\n"

// dial connects to dst for c, of client: at most maxDials at once, and
// MaxDialsPerClient of one client's; nil (c reset) if it cannot.
func (p *Proxy) dial(c *net.TCPConn, client string, dst netip.AddrPort) net.Conn {
	p.mu.Lock()
	if p.dialing[client] >= MaxDialsPerClient {
		p.mu.Unlock()
		reset(c)
		return nil
	}
	p.dialing[client]++
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.dialing[client]--; p.dialing[client] <= 0 {
			delete(p.dialing, client)
		}
	}()
	select {
	case p.dials <- struct{}{}:
	case <-p.ctx.Done():
		return nil
	}
	ctx, cancel := context.WithTimeout(p.ctx, DialWait)
	up, err := p.cfg.Dial(ctx, "tcp", dst.String())
	cancel()
	<-p.dials
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

// untracked is the connection c tracks, or c.
func untracked(c net.Conn) net.Conn {
	if t, ok := c.(tracked); ok {
		return t.Conn
	}
	return c
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
	up = untracked(up) // the TCP socket itself: the kernel splices it
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
