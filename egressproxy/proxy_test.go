package egressproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// lab is a proxy on loopback whose connections all go to one upstream,
// with a policy that allows api.test and *.ok.test.
type lab struct {
	t       *testing.T
	proxy   *Proxy
	addr    string
	mu      sync.Mutex
	denied  []string // "name: why"
	upNames []string // what the upstream was asked for (SNI or Host)
	dials   int
	read    atomic.Int64 // what the server read of /count's body so far
}

func newLab(t *testing.T, upstream func(t *testing.T, l *lab) net.Listener, change ...func(*Config)) *lab {
	l := &lab{t: t}
	up := upstream(t, l)
	upAddr := up.Addr().(*net.TCPAddr).AddrPort()
	cfg := Config{
		Allow: func(src, dst netip.AddrPort, name string) bool {
			return name == "api.test" || strings.HasSuffix(name, ".ok.test")
		},
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			l.mu.Lock()
			l.dials++
			l.mu.Unlock()
			if addr != upAddr.String() {
				return nil, fmt.Errorf("dialed %s, want the original destination %s", addr, upAddr)
			}
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
		Denied: func(src, dst netip.AddrPort, name, why string) {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.denied = append(l.denied, name+": "+why)
		},
		OriginalDst: func(*net.TCPConn) (netip.AddrPort, error) { return upAddr, nil },
	}
	for _, f := range change {
		f(&cfg)
	}
	l.proxy = New(cfg)
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l.addr = ln.Addr().String()
	go l.proxy.Serve(ln)
	t.Cleanup(func() { l.proxy.Close() })
	return l
}

// dial connects to the proxy, with a minute for what follows; the
// connection closes with the test.
func (l *lab) dial() net.Conn {
	c, err := net.Dial("tcp4", l.addr)
	if err != nil {
		l.t.Fatal(err)
	}
	l.t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(time.Minute))
	return c
}

func (l *lab) seen() (denied, upNames []string, dials int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.denied...), append([]string(nil), l.upNames...), l.dials
}

// tlsUpstream serves TLS for any name, answering "hello NAME\n".
func tlsUpstream(t *testing.T, l *lab) net.Listener {
	ln, err := tls.Listen("tcp4", "127.0.0.1:0", testutil.TLSAnyName(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go testutil.ServeConns(ln, func(c net.Conn) {
		tc := c.(*tls.Conn)
		if tc.Handshake() != nil {
			return
		}
		name := tc.ConnectionState().ServerName
		l.mu.Lock()
		l.upNames = append(l.upNames, name)
		l.mu.Unlock()
		fmt.Fprintf(c, "hello %s\n", name)
	})
	return ln
}

// hello dials the proxy with TLS naming name; what the server said.
func (l *lab) hello(cfg *tls.Config, split bool) (string, error) {
	c, err := net.Dial("tcp4", l.addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	var conn net.Conn = c
	if split {
		conn = splitConn{c}
	}
	tc := tls.Client(conn, cfg)
	tc.SetDeadline(time.Now().Add(time.Minute))
	line, err := bufio.NewReader(tc).ReadString('\n')
	return strings.TrimSpace(line), err
}

// splitConn writes a byte a segment.
type splitConn struct{ net.Conn }

func (c splitConn) Write(b []byte) (int, error) { return testutil.ByteWriter{Conn: c.Conn}.Write(b) }

// TestTLSNames: a ClientHello naming an allowed name reaches the server,
// whole or a byte a segment; one naming another name, none, or hiding it
// (ECH) is refused with an access_denied alert and told, and the server
// never hears of it.
func TestTLSNames(t *testing.T) {
	l := newLab(t, tlsUpstream)
	for _, c := range []struct {
		cfg   *tls.Config
		split bool
		want  string // "" for refused
		why   string
	}{
		{&tls.Config{ServerName: "api.test"}, false, "hello api.test", ""},
		{&tls.Config{ServerName: "API.Test"}, false, "hello API.Test", ""},
		{&tls.Config{ServerName: "a.ok.test"}, true, "hello a.ok.test", ""},
		{&tls.Config{ServerName: "other.test"}, false, "", `"other.test", which the policy does not allow`},
		{&tls.Config{ServerName: "other.test"}, true, "", `"other.test", which the policy does not allow`},
		{&tls.Config{ServerName: "ok.test"}, false, "", `"ok.test"`},
		{&tls.Config{}, false, "", "TLS names no name"},
		{&tls.Config{ServerName: "api.test", EncryptedClientHelloConfigList: testutil.ECHConfigList(t, "api.test"), MinVersion: tls.VersionTLS13}, false, "", "ECH"},
	} {
		c.cfg.InsecureSkipVerify = true
		got, err := l.hello(c.cfg, c.split)
		if c.want != "" {
			if got != c.want {
				t.Errorf("%q (split %v): got %q (%v), want %q", c.cfg.ServerName, c.split, got, err, c.want)
			}
			continue
		}
		if got != "" || err == nil || !strings.Contains(err.Error(), "access denied") {
			t.Errorf("%q (split %v): got %q, %v; want refused with access_denied", c.cfg.ServerName, c.split, got, err)
		}
		denied, _, _ := l.seen()
		if len(denied) == 0 || !strings.Contains(denied[len(denied)-1], c.why) {
			t.Errorf("%q: denied %q, want the last with %q", c.cfg.ServerName, denied, c.why)
		}
	}
	denied, upNames, dials := l.seen()
	if want := []string{"api.test", "API.Test", "a.ok.test"}; strings.Join(upNames, ",") != strings.Join(want, ",") || dials != 3 {
		t.Errorf("the server heard %q in %d dials, want %q: what was refused must never reach it", upNames, dials, want)
	}
	if len(denied) != 5 {
		t.Errorf("told of %d refusals, want 5: %q", len(denied), denied)
	}
}

// TestTLSOuterECH: under `ech: outer` a ClientHello that carries an
// encrypted one is judged by its outer name: an allowed one goes on to
// the server (which here has no ECH key, so the client gives up there),
// another is refused as any other name (TestTLSNames: without it, ECH
// is refused).
func TestTLSOuterECH(t *testing.T) {
	l := newLab(t, tlsUpstream, func(c *Config) {
		c.OuterECH = func(netip.AddrPort) bool { return true }
	})
	ech := func(public string) *tls.Config {
		return &tls.Config{ServerName: "hidden.test", EncryptedClientHelloConfigList: testutil.ECHConfigList(t, public), MinVersion: tls.VersionTLS13, InsecureSkipVerify: true}
	}
	l.hello(ech("api.test"), false)
	denied, upNames, dials := l.seen()
	if len(denied) != 0 || dials != 1 || len(upNames) > 1 || len(upNames) == 1 && upNames[0] != "api.test" {
		t.Errorf("ECH with the allowed outer name api.test: denied %q, %d dials, the server heard %q", denied, dials, upNames)
	}
	if _, err := l.hello(ech("other.test"), false); err == nil || !strings.Contains(err.Error(), "access denied") {
		t.Errorf("ECH with the outer name other.test: %v, want access_denied", err)
	}
	if denied, _, dials := l.seen(); len(denied) != 1 || !strings.Contains(denied[0], `"other.test", which the policy does not allow`) || dials != 1 {
		t.Errorf("ECH with the outer name other.test: denied %q, %d dials", denied, dials)
	}
}

// httpUpstream serves HTTP, answering each request with its Host and
// the length of its body; /ws switches to WebSocket when asked (and
// echoes what follows), anything else ignores an Upgrade; what a request
// asked to upgrade to is heard as "upgrade PROTO".
func httpUpstream(t *testing.T, l *lab) net.Listener {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l.mu.Lock()
		l.upNames = append(l.upNames, r.Host)
		for _, u := range r.Header["Upgrade"] {
			l.upNames = append(l.upNames, "upgrade "+u)
		}
		l.mu.Unlock()
		switch r.URL.Path {
		case "/hints": // a 103 before the answer
			w.Header().Set("Link", "</style.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
		case "/bighead": // a head past any bound
			w.Header().Set("X-Big", strings.Repeat("a", 1<<20))
		case "/big": // a body of known length, n bytes of pattern
			n, _ := strconv.Atoi(r.URL.Query().Get("n"))
			w.Header().Set("Content-Length", strconv.Itoa(n))
			w.Write(pattern(n))
			return
		case "/count": // its body read as it comes, counted
			l.read.Store(0)
			buf := make([]byte, 32<<10)
			for {
				n, err := r.Body.Read(buf)
				l.read.Add(int64(n))
				if err != nil {
					break
				}
			}
			fmt.Fprintf(w, "host %s body %d", r.Host, l.read.Load())
			return
		case "/chunked": // a body of unknown length
			io.WriteString(w, "one ")
			w.(http.Flusher).Flush()
			io.WriteString(w, "two")
			return
		}
		if slices.Contains(r.Header["Upgrade"], "h2c") || r.URL.Path == "/wsbad" {
			// A server that switches to h2c when asked (or, at /wsbad,
			// whatever it was asked).
			c, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n")
			brw.Flush()
			io.Copy(c, brw)
			return
		}
		if r.URL.Path == "/ws" && r.Header.Get("Upgrade") == "websocket" {
			c, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
			brw.Flush()
			io.Copy(c, brw) // echo
			return
		}
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "host %s body %d", r.Host, len(body))
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln
}

// exchange writes raw requests on one connection and reads what comes
// back until the connection ends.
func (l *lab) exchange(t *testing.T, raw ...string) string {
	c, err := net.Dial("tcp4", l.addr)
	if err != nil {
		return "[true]" // reset before the dial returned
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Minute))
	br := bufio.NewReader(c)
	var out strings.Builder
	for _, r := range raw {
		if _, err := io.WriteString(c, r); err != nil {
			out.WriteString("[true]") // reset before the write
			break
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			fmt.Fprintf(&out, "[%v]", errors.Unwrap(err) != nil || err != nil)
			break
		}
		body, _ := io.ReadAll(resp.Body)
		fmt.Fprintf(&out, "%d %s|", resp.StatusCode, body)
	}
	return out.String()
}

// TestHTTPHosts: each request's Host is checked, the second one's on a
// kept-alive connection too, and one in an absolute URI; a refused
// request never reaches the server; HTTP/2's preface, CONNECT and what is
// not HTTP are refused.
func TestHTTPHosts(t *testing.T) {
	l := newLab(t, httpUpstream)
	get := func(host string) string { return "GET / HTTP/1.1\r\nHost: " + host + "\r\n\r\n" }
	for _, c := range []struct {
		name string
		raw  []string
		want string
	}{
		{"allowed", []string{get("api.test")}, "200 host api.test body 0|"},
		{"allowed, with a port and a body", []string{"POST /x HTTP/1.1\r\nHost: API.test:80\r\nContent-Length: 3\r\n\r\nabc"}, "200 host API.test:80 body 3|"},
		{"chunked body", []string{"POST /x HTTP/1.1\r\nHost: a.ok.test\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"}, "200 host a.ok.test body 3|"},
		{"refused", []string{get("other.test")}, "403 " + forbidden + "|"},
		{"refused second", []string{get("api.test"), get("other.test")}, "200 host api.test body 0|403 " + forbidden + "|"},
		// (The reset may come before the first answer is read: the server's
		// log below is what counts.)
		{"second in the same segment", []string{"POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: 0\r\n\r\n" + get("other.test")}, ""},
		{"absolute URI", []string{"GET http://other.test/ HTTP/1.1\r\nHost: api.test\r\n\r\n"}, "403 " + forbidden + "|"},
		{"HTTP/2 preface", []string{"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"}, "403 " + forbidden + "|"},
		{"CONNECT", []string{"CONNECT other.test:443 HTTP/1.1\r\nHost: api.test\r\n\r\n"}, "403 " + forbidden + "|"},
		{"not HTTP", []string{"SSH-2.0-x\r\n\r\n"}, "400 |"},
	} {
		if got := l.exchange(t, c.raw...); got != c.want && c.want != "" {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
	_, upNames, _ := l.seen()
	for _, n := range upNames {
		if !strings.Contains(strings.ToLower(n), "api.test") && !strings.Contains(n, "ok.test") {
			t.Errorf("the server heard a request for %q", n)
		}
	}
}

// pattern is n bytes that differ from one offset to the next.
func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i * 7 / 5)
	}
	return b
}

// TestHTTPBodiesOfKnownLength: bodies of known length, which the proxy
// splices from socket to socket past what it buffered of them, arrive
// whole both ways, and the request after one on a kept-alive connection,
// sent with its body's last bytes, is read and checked as the first was.
func TestHTTPBodiesOfKnownLength(t *testing.T) {
	l := newLab(t, httpUpstream)
	const n = 3<<20 + 17
	body := string(pattern(n))
	post := "POST /x HTTP/1.1\r\nHost: api.test\r\nContent-Length: " + strconv.Itoa(n) + "\r\n\r\n" + body
	get := func(host string) string { return "GET / HTTP/1.1\r\nHost: " + host + "\r\n\r\n" }
	want := fmt.Sprintf("200 host api.test body %d|200 host api.test body 0|403 %s|", n, forbidden)
	if got := l.exchange(t, post, get("api.test"), get("other.test")); got != want {
		t.Errorf("posts one by one: got %.80q, want %q", got, want)
	}
	// The next request in the same write as the body's end.
	c := l.dial()
	go io.WriteString(c, post+get("other.test"))
	br := bufio.NewReader(c)
	var got []string
	for range 2 {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			break // the reset may come before the answer is read
		}
		b, _ := io.ReadAll(resp.Body)
		got = append(got, fmt.Sprintf("%d %.60s", resp.StatusCode, b))
	}
	if len(got) == 0 || got[0] != fmt.Sprintf("200 host api.test body %d", n) || len(got) > 1 && !strings.HasPrefix(got[1], "403") {
		t.Errorf("a post with the next request in its last write: %q", got)
	}
	_, upNames, _ := l.seen()
	if slices.Contains(upNames, "other.test") {
		t.Errorf("the server heard a request for other.test: %q", upNames)
	}

	// A body whose last bytes come once the server read all before
	// them: the proxy, woken for the last bytes only once many wait
	// while more were to come, must not wait for more than are left.
	c3 := l.dial()
	const tail = 1000
	io.WriteString(c3, "POST /count HTTP/1.1\r\nHost: api.test\r\nContent-Length: "+strconv.Itoa(n)+"\r\n\r\n"+body[:n-tail])
	waitFor(t, "the server read all bytes sent", func() bool { return l.read.Load() >= n-tail })
	io.WriteString(c3, body[n-tail:])
	if resp, err := http.ReadResponse(bufio.NewReader(c3), nil); err != nil {
		t.Errorf("a body's last bytes, sent late: %v", err)
	} else if b, _ := io.ReadAll(resp.Body); string(b) != fmt.Sprintf("host api.test body %d", n) {
		t.Errorf("a body's last bytes, sent late: %q", b)
	}

	// A slow sender's bytes, fewer than the proxy waits for while more
	// are to come, reach the server all the same (after heldWait): a
	// client may send part of a body and wait for the server.
	slow := newLab(t, httpUpstream) // (its server's count alone)
	c4 := slow.dial()
	// (First a body whole: the connection's window grows past a
	// segment, as it does on any path; on a fresh loopback connection
	// the kernel wakes the reader at once, its window a segment wide.)
	io.WriteString(c4, post)
	if resp, err := http.ReadResponse(bufio.NewReader(c4), nil); err != nil {
		t.Fatal(err)
	} else {
		io.ReadAll(resp.Body)
	}
	io.WriteString(c4, "POST /count HTTP/1.1\r\nHost: api.test\r\nContent-Length: "+strconv.Itoa(n)+"\r\n\r\n"+body[:1000])
	waitFor(t, "the server read the first 1,000 bytes of a body", func() bool { return slow.read.Load() >= 1000 })
	io.WriteString(c4, body[1000:31000]) // (the proxy waits for more now)
	waitFor(t, "the server read the 31,000 bytes sent of a body of "+strconv.Itoa(n), func() bool { return slow.read.Load() >= 31000 })

	// Downloads, one after the other on one connection.
	c2 := l.dial()
	br2 := bufio.NewReader(c2)
	for _, size := range []int{n, 1, 100000} {
		io.WriteString(c2, "GET /big?n="+strconv.Itoa(size)+" HTTP/1.1\r\nHost: api.test\r\n\r\n")
		resp, err := http.ReadResponse(br2, nil)
		if err != nil {
			t.Fatalf("GET /big?n=%d: %v", size, err)
		}
		b, err := io.ReadAll(resp.Body)
		if err != nil || resp.ContentLength != int64(size) || string(b) != string(pattern(size)) {
			t.Errorf("GET /big?n=%d: %d bytes (length %d), as sent: %v, %v", size, len(b), resp.ContentLength, string(b) == string(pattern(size)), err)
		}
	}
}

// earlyUp is an upstream that answers each request once it read its head
// and then discards its body (Content-Length bytes) before it reads the
// next, as nginx does for a request whose handler reads no body (a static
// file, a redirect, a 404); it records each Host it heard.
type earlyUp struct {
	mu    sync.Mutex
	heard []string
}

func (u *earlyUp) upstream(t *testing.T, l *lab) net.Listener {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go testutil.ServeConns(ln, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			u.mu.Lock()
			u.heard = append(u.heard, req.Host)
			u.mu.Unlock()
			b := "host " + req.Host
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(b), b)
			if _, err := io.Copy(io.Discard, req.Body); err != nil {
				return
			}
		}
	})
	return ln
}

func (u *earlyUp) seen() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.heard)
}

// sendUrgent sends b as TCP urgent data (MSG_OOB): in the stream, its
// last byte marked urgent.
func sendUrgent(t *testing.T, c net.Conn, b []byte) {
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	rc.Write(func(fd uintptr) bool {
		serr = syscall.Sendto(int(fd), b, syscall.MSG_OOB, nil)
		return serr != syscall.EAGAIN
	})
	if serr != nil {
		t.Fatal(serr)
	}
}

// waitFor waits, a minute at most, until ok.
func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !ok(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("a minute on, still not: %s", what)
		}
	}
}

// TestHTTPUrgentData: a byte a guest marks urgent in a body (TCP urgent
// data) is out of the stream for the proxy as for the server it writes
// to: splice(2), which stops at the mark where read(2) skips the urgent
// byte, had the proxy count a body whole that the server got short of,
// and the server took the start of the next request, checked, for the
// rest of the body, and what that request's body held as a request of its
// own, for any name (a review found it); or it held the copy at the mark
// for good.
func TestHTTPUrgentData(t *testing.T) {
	const n, m = 100000, 50000
	body := string(pattern(n))

	// The request after the body, with one for evil.test in its body
	// where the server would look for its next request.
	u := &earlyUp{}
	l := newLab(t, u.upstream)
	head1 := "POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: " + strconv.Itoa(n) + "\r\n\r\n"
	evil := "GET /secret HTTP/1.1\r\nHost: evil.test\r\n\r\n"
	tail := testutil.SmuggledTail(n-m, evil)
	c := l.dial()
	io.WriteString(c, head1+body[:m])
	waitFor(t, "the server heard the first request", func() bool { return len(u.seen()) > 0 })
	sendUrgent(t, c, []byte{'!'})
	io.WriteString(c, body[m:]+tail)
	c.(*net.TCPConn).CloseWrite()
	br := bufio.NewReader(c)
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			break
		}
		io.ReadAll(resp.Body)
	}
	for _, h := range u.seen() {
		if h != "api.test" {
			t.Errorf("the server heard a request for %q", h)
		}
	}

	// A body with an urgent byte, the client's side left open, to a
	// server that reads the body whole before it answers: answered.
	l = newLab(t, httpUpstream)
	c = l.dial()
	io.WriteString(c, "POST /count HTTP/1.1\r\nHost: api.test\r\nContent-Length: "+strconv.Itoa(n)+"\r\n\r\n"+body[:m])
	waitFor(t, "the server read the body's first part", func() bool { return l.read.Load() >= m })
	sendUrgent(t, c, []byte{'!'})
	io.WriteString(c, body[m:])
	if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil {
		t.Errorf("a body with an urgent byte: %v (the server read %d bytes of %d)", err, l.read.Load(), n)
	} else if b, _ := io.ReadAll(resp.Body); string(b) != fmt.Sprintf("host api.test body %d", n) {
		t.Errorf("a body with an urgent byte: %q", b)
	}
}

// TestNotRedirected: a connection made to the proxy's own port, not
// redirected to it, is refused (it would be dialed back to the proxy).
func TestNotRedirected(t *testing.T) {
	l := newLab(t, httpUpstream, func(cfg *Config) {
		cfg.OriginalDst = func(c *net.TCPConn) (netip.AddrPort, error) { return addrPortOf(c.LocalAddr()), nil }
	})
	if got := l.exchange(t, "GET / HTTP/1.1\r\nHost: api.test\r\n\r\n"); got != "[true]" {
		t.Errorf("got %q, want the connection reset", got)
	}
	if _, _, dials := l.seen(); dials != 0 {
		t.Errorf("dialed %d times", dials)
	}
}

// TestBoundedPerSource: a source that opens connections and sends
// nothing holds MaxPerClient of them; the next is refused and told.
func TestBoundedPerSource(t *testing.T) {
	l := newLab(t, httpUpstream)
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range MaxPerClient {
		c, err := net.Dial("tcp4", l.addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		l.proxy.mu.Lock()
		n := l.proxy.total
		l.proxy.mu.Unlock()
		if n == MaxPerClient {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d connections admitted, want %d", n, MaxPerClient)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := l.exchange(t, "GET / HTTP/1.1\r\nHost: api.test\r\n\r\n"); got != "[true]" {
		t.Errorf("connection %d: got %q, want it reset", MaxPerClient+1, got)
	}
	denied, _, _ := l.seen()
	if len(denied) != 1 || !strings.Contains(denied[0], "too many") {
		t.Errorf("denied %q", denied)
	}
	// The bound is per source and connections: one closed frees its slot.
	conns[0].Close()
	conns = conns[1:]
	testEventually(t, func() bool {
		return strings.HasPrefix(l.exchange(t, "GET / HTTP/1.1\r\nHost: api.test\r\n\r\n"), "200")
	})
}

func testEventually(t *testing.T, ok func() bool) {
	deadline := time.Now().Add(time.Minute)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatal("not within a minute")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestHTTPUpgrades: an upgrade to WebSocket that the server grants
// passes what follows both ways; one it refuses leaves the connection
// HTTP, its next request checked; any other upgrade (h2c, whose requests
// the proxy could not read) is taken out of the request.
func TestHTTPUpgrades(t *testing.T) {
	l := newLab(t, httpUpstream)
	ws := "GET /ws HTTP/1.1\r\nHost: api.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
	c, err := net.Dial("tcp4", l.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Minute))
	br := bufio.NewReader(c)
	io.WriteString(c, ws)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("the upgrade to WebSocket: %v, %v", resp, err)
	}
	io.WriteString(c, "frames, as they are\n")
	if line, err := br.ReadString('\n'); line != "frames, as they are\n" {
		t.Errorf("after the switch, the echo: %q, %v", line, err)
	}
	// Refused (the server answers 200): the next request is checked.
	nows := strings.Replace(ws, "/ws", "/nows", 1)
	if got := l.exchange(t, nows, "GET / HTTP/1.1\r\nHost: other.test\r\n\r\n"); got != "200 host api.test body 0|403 "+forbidden+"|" {
		t.Errorf("a refused upgrade, then another host: %q", got)
	}
	// h2c: taken out.
	h2c := "GET / HTTP/1.1\r\nHost: api.test\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\nConnection: Upgrade, HTTP2-Settings\r\n\r\n"
	if got := l.exchange(t, h2c); got != "200 host api.test body 0|" {
		t.Errorf("an h2c upgrade: %q", got)
	}
	_, heard, _ := l.seen()
	for _, h := range heard {
		if h == "upgrade h2c" || h == "other.test" {
			t.Errorf("the server heard %q", h)
		}
	}
	if !slices.Contains(heard, "upgrade websocket") {
		t.Errorf("the server heard no WebSocket upgrade: %q", heard)
	}
}

// TestHTTPExpectAndHalfClose: a client that waits for 100 Continue gets
// it and its body through; one that ends its sending side after its
// request still gets the whole answer.
func TestHTTPExpectAndHalfClose(t *testing.T) {
	l := newLab(t, httpUpstream)
	c, err := net.Dial("tcp4", l.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Minute))
	br := bufio.NewReader(c)
	io.WriteString(c, "POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
	if line, err := br.ReadString('\n'); !strings.HasPrefix(line, "HTTP/1.1 100") {
		t.Fatalf("before the body: %q, %v", line, err)
	}
	br.ReadString('\n') // the blank line
	io.WriteString(c, "hello")
	c.(*net.TCPConn).CloseWrite()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if string(body) != "host api.test body 5" {
		t.Errorf("the answer after a half-close: %q", body)
	}
}

// TestNotNames: a name that is no DNS name (a Kelvin sign that would be
// sent as punycode, a comma, a NUL) is refused, though a policy's
// wildcard would match its tail.
func TestNotNames(t *testing.T) {
	l := newLab(t, httpUpstream)
	for _, host := range []string{"\u212a.ok.test", "evil.test,x.ok.test", "]api.test[", "api.test:x,evil.test"} {
		if got := l.exchange(t, "GET / HTTP/1.1\r\nHost: "+host+"\r\n\r\n"); !strings.HasPrefix(got, "403 ") && got != "400 |" {
			t.Errorf("Host %q: %q", host, got)
		}
	}
	if _, heard, _ := l.seen(); len(heard) != 0 {
		t.Errorf("the server heard %q", heard)
	}
	tl := newLab(t, tlsUpstream)
	for _, name := range []string{"evil.test\x00.ok.test", "evil.test/.ok.test"} {
		if got, err := tl.hello(&tls.Config{ServerName: name, InsecureSkipVerify: true}, false); err == nil {
			t.Errorf("SNI %q: got %q", name, got)
		}
	}
	if _, heard, _ := tl.seen(); len(heard) != 0 {
		t.Errorf("the TLS server heard %q", heard)
	}
}

// TestCloseEndsDials: Close does not wait for a dial to a destination
// that never answers (it would, two minutes).
func TestCloseEndsDials(t *testing.T) {
	dialing := make(chan struct{})
	l := newLab(t, httpUpstream, func(cfg *Config) {
		cfg.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			close(dialing)
			<-ctx.Done()
			return nil, ctx.Err()
		}
	})
	c, err := net.Dial("tcp4", l.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: api.test\r\n\r\n")
	<-dialing
	closed := make(chan struct{})
	go func() { l.proxy.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(DialWait / 2):
		t.Fatal("Close waited for a dial")
	}
}

// TestHTTPUpgradeTricks: a second Upgrade line (h2c behind WebSocket)
// is no WebSocket: both are taken out; a server that answers a WebSocket
// upgrade with a switch to something else is not passed.
func TestHTTPUpgradeTricks(t *testing.T) {
	l := newLab(t, httpUpstream)
	two := "GET / HTTP/1.1\r\nHost: api.test\r\nUpgrade: websocket\r\nUpgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n"
	if got := l.exchange(t, two); got != "200 host api.test body 0|" {
		t.Errorf("WebSocket and h2c upgrades in two lines: %q", got)
	}
	ws := "GET /wsbad HTTP/1.1\r\nHost: api.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
	if got := l.exchange(t, ws); strings.HasPrefix(got, "101") {
		t.Errorf("a switch to h2c for a WebSocket upgrade was passed: %q", got)
	}
	_, heard, _ := l.seen()
	if slices.Contains(heard, "upgrade h2c") {
		t.Errorf("the server heard an h2c upgrade: %q", heard)
	}
}

// TestHTTPAnswers: an interim answer (103) reaches the client before the
// final one; a head past the bound ends the connection, nothing passed;
// an HTTP/1.0 client gets 1.0, never chunks.
func TestHTTPAnswers(t *testing.T) {
	l := newLab(t, httpUpstream)
	c, err := net.Dial("tcp4", l.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Minute))
	br := bufio.NewReader(c)
	io.WriteString(c, "GET /hints HTTP/1.1\r\nHost: api.test\r\n\r\n")
	var codes []int
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("after %v: %v", codes, err)
		}
		codes = append(codes, resp.StatusCode)
		if resp.StatusCode >= 200 {
			io.ReadAll(resp.Body)
			break
		}
	}
	if fmt.Sprint(codes) != "[103 200]" {
		t.Errorf("answers %v, want [103 200]", codes)
	}
	// The connection goes on: the next request is answered.
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: api.test\r\n\r\n")
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 {
		t.Errorf("the request after the hints: %v, %v", resp, err)
	}
	if got := l.exchange(t, "GET /bighead HTTP/1.1\r\nHost: api.test\r\n\r\n"); strings.HasPrefix(got, "200") {
		t.Errorf("a head of a MiB passed: %.40q", got)
	}
	c2, err := net.Dial("tcp4", l.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	c2.SetDeadline(time.Now().Add(time.Minute))
	io.WriteString(c2, "GET /chunked HTTP/1.0\r\nHost: api.test\r\n\r\n")
	raw, _ := io.ReadAll(c2)
	if !strings.HasPrefix(string(raw), "HTTP/1.0 200") || strings.Contains(string(raw), "chunked") || !strings.HasSuffix(string(raw), "one two") {
		t.Errorf("an HTTP/1.0 client got:\n%s", raw)
	}
}

// TestDialsBoundedPerClient: a client whose dials hang (destinations that
// never answer) holds MaxDialsPerClient of them; its next connection is
// reset without a dial, and another client's request, dialed meanwhile,
// is answered.
func TestDialsBoundedPerClient(t *testing.T) {
	hung := make(chan struct{})
	defer close(hung)
	var mu sync.Mutex
	dials := 0
	l := newLab(t, httpUpstream, func(cfg *Config) {
		dial := cfg.Dial
		cfg.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			mu.Lock()
			dials++
			n := dials
			mu.Unlock()
			if n <= MaxDialsPerClient { // the hostile client's
				select {
				case <-hung:
				case <-ctx.Done():
				}
				return nil, errors.New("no answer")
			}
			return dial(ctx, network, addr)
		}
	})
	hostile := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	for range MaxDialsPerClient {
		c, err := hostile.Dial("tcp4", l.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: api.test\r\n\r\n")
	}
	testEventually(t, func() bool {
		l.proxy.mu.Lock()
		defer l.proxy.mu.Unlock()
		return l.proxy.dialing["127.0.0.2"] == MaxDialsPerClient
	})
	c, err := hostile.Dial("tcp4", l.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Minute))
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: api.test\r\n\r\n")
	if n, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("the hostile client's dial %d: read %d bytes, %v; want the connection reset", MaxDialsPerClient+1, n, err)
	}
	if got := l.exchange(t, "GET / HTTP/1.1\r\nHost: api.test\r\n\r\n"); !strings.HasPrefix(got, "200") {
		t.Errorf("another client's request while the hostile one's dials hang: %q", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if dials != MaxDialsPerClient+1 {
		t.Errorf("%d dials, want %d: the hostile client's share and the other's one", dials, MaxDialsPerClient+1)
	}
}
