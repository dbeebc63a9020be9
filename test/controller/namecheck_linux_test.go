package controller_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/test/simvm"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

const nameCheckNetworks = `
vmnet:
  sandbox:
    subnet: 10.86.0.0/24
    egress:
      default: deny
      allow: [api.test, host.test]
  open:
    subnet: 10.87.0.0/24
`

// cdn is one address that serves many names (TLS on 443, HTTP on 80,
// UDP on 443 for QUIC), and what it heard.
type cdn struct {
	mu    sync.Mutex
	heard []string // "tls NAME", "http HOST", "udp"
}

func (c *cdn) add(s string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.heard = append(c.heard, s)
}

func (c *cdn) all() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.heard...)
}

func serveCDN(t *testing.T, ns *testutil.NS, ip string) *cdn {
	c := &cdn{}
	network, udp := "tcp4", "udp4"
	if strings.Contains(ip, ":") {
		network, udp, ip = "tcp6", "udp6", "["+ip+"]"
	}
	tl := tls.NewListener(ns.Listen(t, network, ip+":443"), testutil.TLSAnyName(t))
	go testutil.ServeConns(tl, func(conn net.Conn) {
		tc := conn.(*tls.Conn)
		if tc.Handshake() != nil {
			return
		}
		name := tc.ConnectionState().ServerName
		c.add("tls " + name)
		fmt.Fprintf(tc, "hello %s\n", name)
	})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.add("http " + r.Host)
		fmt.Fprintf(w, "host %s", r.Host)
	})}
	go srv.Serve(ns.Listen(t, network, ip+":80"))
	t.Cleanup(func() { srv.Close() })
	pc := ns.ListenPacket(t, udp, ip+":443")
	go func() {
		buf := make([]byte, 2048)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
			c.add("udp")
		}
	}()
	return c
}

// tlsHello opens TLS to addr from vm, naming cfg.ServerName; the server's
// line, or the error.
func tlsHello(vm *simvm.VM, addr string, cfg *tls.Config, split bool) (string, error) {
	var line string
	err := vm.Do(func() error {
		c, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(30 * time.Second))
		var conn net.Conn = c
		if split {
			conn = splitConn{c}
		}
		cfg.InsecureSkipVerify = true
		line, err = bufio.NewReader(tls.Client(conn, cfg)).ReadString('\n')
		line = strings.TrimSpace(line)
		return err
	})
	return line, err
}

type splitConn struct{ net.Conn }

func (c splitConn) Write(b []byte) (int, error) { return testutil.ByteWriter{Conn: c.Conn}.Write(b) }

// httpGet sends one request per host on one connection from vm; the
// status line and body of each answer, "reset" where the connection
// ended.
func httpGet(vm *simvm.VM, addr string, hosts ...string) string {
	var out strings.Builder
	vm.Do(func() error {
		c, err := net.DialTimeout("tcp4", addr, 10*time.Second)
		if err != nil {
			out.WriteString("no connection")
			return nil
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(30 * time.Second))
		br := bufio.NewReader(c)
		for _, h := range hosts {
			fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", h)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				out.WriteString("reset|")
				return nil
			}
			body, _ := io.ReadAll(resp.Body)
			fmt.Fprintf(&out, "%d %s|", resp.StatusCode, strings.TrimSpace(string(body)))
		}
		return nil
	})
	return out.String()
}

// urgentPost sends from vm, on one connection to addr, a POST to api.test
// whose body of n bytes has a byte marked urgent (TCP urgent data, out
// of the stream as a reader reads it) halfway, then a POST to api.test
// whose body holds a request for other.test where a server that took the
// first body short of that byte's place would look for its next request,
// and half-closes; the answers' status lines and bodies, once the
// connection ends.
func urgentPost(vm *simvm.VM, addr string) string {
	const n, m = 100000, 50000
	evil := "GET /secret HTTP/1.1\r\nHost: other.test\r\n\r\n"
	tail := testutil.SmuggledTail(n-m, evil)
	body := strings.Repeat("b", n)
	var out strings.Builder
	vm.Do(func() error {
		c, err := net.DialTimeout("tcp4", addr, 10*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(time.Minute))
		io.WriteString(c, "POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: "+strconv.Itoa(n)+"\r\n\r\n"+body[:m])
		rc, err := c.(*net.TCPConn).SyscallConn()
		if err != nil {
			return err
		}
		rc.Write(func(fd uintptr) bool {
			return unix.Sendto(int(fd), []byte{'!'}, unix.MSG_OOB, nil) != unix.EAGAIN
		})
		io.WriteString(c, body[m:]+tail)
		c.(*net.TCPConn).CloseWrite()
		br := bufio.NewReader(c)
		for {
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				return nil
			}
			b, _ := io.ReadAll(resp.Body)
			fmt.Fprintf(&out, "%d %s|", resp.StatusCode, b)
		}
	})
	return out.String()
}

// TestEgressNameCheck: on a name policy, what a connection names is
// checked, not only its address (issue 33). Two names on one address (a
// CDN's): the VM that resolved the allowed one reaches it over TLS and
// HTTP, and is refused the other name on the same address, whether its
// ClientHello comes whole or a byte a segment, named in a second request
// on a kept-alive connection, hidden by ECH, or left out; QUIC to it is
// refused, its own resolver unreachable; each refusal is counted and
// told as an egress-denied event with the name; a VM's own policy is
// checked the same way; a VM on a network without a policy is not
// touched.
func TestEgressNameCheck(t *testing.T) {
	h := &host{Host: simvm.NewHost(t, "vmnnc", nameCheckNetworks, "pgrep"), t: t}
	lan := testutil.NewNS(t, "nclan")
	link(t, h, "lan", "198.51.100.1/24", lan, "198.51.100.2/24", "2001:db8:100::2/64")
	h.MustRun(t, "ip", "addr", "add", "2001:db8:100::1/64", "dev", "lan", "nodad")
	h.MustRun(t, "ip", "-6", "route", "add", "default", "via", "2001:db8:100::2")
	cdn := serveCDN(t, lan, "198.51.100.2")
	cdn6 := serveCDN(t, lan, "2001:db8:100::2")
	const both = "198.51.100.2,2001:db8:100::2"
	serveDNS(t, lan, "198.51.100.2:53", map[string]string{"api.test.": both, "other.test.": both, "host.test.": "198.51.100.1"})
	// A TLS server on another port of the CDN, and an HTTP one on the
	// host's own address, which an allowed name points at.
	tls8443 := tls.NewListener(lan.Listen(t, "tcp4", "198.51.100.2:8443"), testutil.TLSAnyName(t))
	go func() {
		for {
			c, err := tls8443.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if c.(*tls.Conn).Handshake() == nil {
					cdn.add("tls 8443 " + c.(*tls.Conn).ConnectionState().ServerName)
					fmt.Fprintf(c, "hello %s\n", c.(*tls.Conn).ConnectionState().ServerName)
				}
			}()
		}
	}()
	hostSrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "the host") })}
	go hostSrv.Serve(h.Listen(t, "tcp4", "198.51.100.1:80"))
	t.Cleanup(func() { hostSrv.Close() })
	etc := filepath.Join("/etc/netns", h.Name)
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(etc) })
	if err := os.WriteFile(filepath.Join(etc, "resolv.conf"), []byte("nameserver 198.51.100.2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h.MustVmnetctl("up", "-f", h.WriteFile("vms.yaml", `vms:
  s:
    networks:
      - vmnet: sandbox
  o:
    networks:
      - vmnet: open
  p:
    networks:
      - vmnet: open
        egress: {default: deny, allow: [api.test]}
  q:
    networks:
      - vmnet: open
        egress: {default: deny, allow: [api.test], ech: outer}
`))
	st := h.Status()
	s, o, p, q := h.VM(h.Attachment(st, "s")), h.VM(h.Attachment(st, "o")), h.VM(h.Attachment(st, "p")), h.VM(h.Attachment(st, "q"))
	for _, vm := range []*simvm.VM{s, o, p, q} {
		vm.DHCP(t)
	}
	const addr443, addr80 = "198.51.100.2:443", "198.51.100.2:80"
	// Before it resolved api.test, s reaches nothing there.
	if got, err := tlsHello(s, addr443, &tls.Config{ServerName: "api.test"}, false); err == nil {
		t.Fatalf("s reached the CDN before resolving api.test: %q", got)
	}
	for vm, gw := range map[*simvm.VM]string{s: "10.86.0.1", p: "10.87.0.1"} {
		if out, err := vm.Run(context.Background(), "busybox", "nslookup", "-type=a", "api.test", gw); err != nil {
			t.Fatalf("%s resolving api.test: %v\n%s", vm.Name, err, out)
		}
	}
	// Where this kernel queues packets to user space, TLS goes through
	// the name check's gate, not its proxy: nothing reaches the server
	// before the verdict, so the ClientHello must come within the
	// sender's first window, and one sent a byte a segment is refused
	// (the proxy, which acknowledges every byte, lets it through).
	_, noGate := h.Run(context.Background(), "nft", "list", "chain", "inet", "vmnetctl-sandbox", "name-gate")
	gated := noGate == nil
	t.Logf("the name check's gate: %v", gated)
	for _, vm := range []*simvm.VM{s, p} {
		for _, c := range []struct {
			cfg   *tls.Config
			split bool
			want  string
		}{
			{&tls.Config{ServerName: "api.test"}, false, "hello api.test"},
			{&tls.Config{ServerName: "other.test"}, false, ""}, // (the first refusal: told in events, below)
			{&tls.Config{ServerName: "api.test"}, true, "hello api.test"},
			{&tls.Config{ServerName: "other.test"}, true, ""},
			{&tls.Config{}, false, ""}, // no name
			{&tls.Config{ServerName: "api.test", EncryptedClientHelloConfigList: testutil.ECHConfigList(t, "api.test"), MinVersion: tls.VersionTLS13}, false, ""},
		} {
			if gated && c.split {
				c.want = ""
			}
			got, err := tlsHello(vm, addr443, c.cfg, c.split)
			if got != c.want || (c.want == "" && err == nil) {
				t.Errorf("%s, TLS naming %q (ECH %v, a byte a segment %v): got %q (%v), want %q", vm.Name, c.cfg.ServerName, c.cfg.EncryptedClientHelloConfigList != nil, c.split, got, err, c.want)
			}
		}
	}
	// q's policy says `ech: outer`: its ECH ClientHello is judged by its
	// outer name, api.test, and goes on to the CDN, whose server has no
	// ECH key: the client gives up there (the server rejected ECH, or its
	// certificate for the outer name did not verify), not at the proxy.
	if out, err := q.Run(context.Background(), "busybox", "nslookup", "-type=a", "api.test", "10.87.0.1"); err != nil {
		t.Fatalf("q resolving api.test: %v\n%s", err, out)
	}
	if _, err := tlsHello(q, addr443, &tls.Config{ServerName: "api.test", EncryptedClientHelloConfigList: testutil.ECHConfigList(t, "api.test"), MinVersion: tls.VersionTLS13}, false); err == nil || strings.Contains(err.Error(), "access denied") || !strings.Contains(err.Error(), "ECH") && !strings.Contains(err.Error(), "certificate") {
		t.Errorf("q (ech: outer), ECH with the outer name api.test: %v, want the server's ECH rejection, past the proxy", err)
	}
	if got := httpGet(s, addr80, "api.test", "api.test"); got != "200 host api.test|200 host api.test|" {
		t.Errorf("s, HTTP to api.test twice: %q", got)
	}
	if got := httpGet(s, addr80, "other.test"); !strings.HasPrefix(got, "403 ") {
		t.Errorf("s, HTTP to other.test: %q, want 403", got)
	}
	if got := httpGet(s, addr80, "api.test", "other.test"); got != "200 host api.test|403 vmnetctl: the egress policy does not allow this host|" {
		t.Errorf("s, HTTP to api.test then other.test on one connection: %q", got)
	}
	// A hostile guest's urgent byte in a body, and a request for
	// other.test where a server that read the body short would take it
	// for one: the proxy reads the stream as the server does.
	if got := urgentPost(s, addr80); got != "200 host api.test|200 host api.test|" {
		t.Errorf("s, a body with an urgent byte, then another request: %q, want both answered", got)
	}
	if slices.Contains(cdn.all(), "http other.test") {
		t.Errorf("s, a body with an urgent byte: the CDN heard a request for other.test: %q", cdn.all())
	}
	// Another port of the allowed name's address: judged by the prefixes
	// (a name allows HTTP and HTTPS alone), so refused.
	if got, err := tlsHello(s, "198.51.100.2:8443", &tls.Config{ServerName: "other.test"}, false); err == nil {
		t.Errorf("s, TLS naming other.test on the CDN's port 8443: got %q", got)
	}
	// An allowed name that points at the host's own address: the check
	// never dials it (the forward chain would never let a VM's
	// connection through to it).
	if out, err := s.Run(context.Background(), "busybox", "nslookup", "-type=a", "host.test", "10.86.0.1"); err != nil {
		t.Fatalf("s resolving host.test: %v\n%s", err, out)
	}
	if got := httpGet(s, "198.51.100.1:80", "host.test"); strings.Contains(got, "the host") {
		t.Errorf("s, HTTP to host.test, the host's own address: %q", got)
	}
	// The neighbour without a policy: untouched.
	if got, err := tlsHello(o, addr443, &tls.Config{ServerName: "other.test"}, false); got != "hello other.test" {
		t.Errorf("o (no policy), TLS naming other.test: got %q (%v)", got, err)
	}
	// QUIC: s's datagrams to 443 never arrive, whole or in fragments (the
	// host reassembles them before it judges); o's do (the control).
	for _, vm := range []*simvm.VM{s, o} {
		vm.Do(func() error {
			c, err := net.Dial("udp4", addr443)
			if err != nil {
				return err
			}
			defer c.Close()
			if vm == s {
				c.Write([]byte(strings.Repeat("fragmented quic initial ", 200)))
			}
			_, err = c.Write([]byte("quic initial from " + vm.Name))
			return err
		})
	}
	testutil.Eventually(t, 10*time.Second, func() error {
		for _, heard := range cdn.all() {
			if heard == "udp" {
				return nil
			}
		}
		return fmt.Errorf("o's datagram has not arrived")
	}, "the control datagram")
	udp := 0
	for _, heard := range cdn.all() {
		if heard == "udp" {
			udp++
		}
		if strings.Contains(heard, "other.test") && heard != "tls other.test" {
			t.Errorf("the CDN heard %q from a VM whose policy allows only api.test", heard)
		}
	}
	if udp != 1 {
		t.Errorf("the CDN heard %d datagrams on 443, want o's alone", udp)
	}
	if n := strings.Count(strings.Join(cdn.all(), ","), "tls other.test"); n != 1 {
		t.Errorf("the CDN heard TLS for other.test %d times, want once (o's)", n)
	}
	// Over IPv6 alike: once s resolved api.test's AAAA (through the
	// network's proxy), its address passes the check for api.test alone.
	slaacAddress(t, s, api.ULAPrefix("sandbox").String())
	if out, err := s.Run(context.Background(), "busybox", "nslookup", "-type=aaaa", "api.test", "10.86.0.1"); err != nil || !strings.Contains(out, "2001:db8:100::2") {
		t.Fatalf("s resolving api.test's AAAA: %v\n%s", err, out)
	}
	const addr6 = "[2001:db8:100::2]:443"
	for _, c := range []struct{ name, want string }{{"api.test", "hello api.test"}, {"other.test", ""}} {
		got, err := tlsHello(s, addr6, &tls.Config{ServerName: c.name}, false)
		if got != c.want || (c.want == "" && err == nil) {
			t.Errorf("s over IPv6, TLS naming %s: got %q (%v), want %q", c.name, got, err, c.want)
		}
	}
	if heard := cdn6.all(); len(heard) != 1 || heard[0] != "tls api.test" {
		t.Errorf("the CDN heard over IPv6 %q, want api.test alone", heard)
	}
	// Its own resolver (the CDN's address on 53): refused.
	if out, err := s.Run(context.Background(), "busybox", "nslookup", "-type=a", "other.test", "198.51.100.2"); err == nil {
		t.Errorf("s resolved through its own resolver:\n%s", out)
	}

	st = h.Status()
	if got := h.Attachment(st, "s").EgressDenied; got < 7 {
		t.Errorf("s: %d refused connections counted, want 7 or more", got)
	}
	if got := h.Attachment(st, "p").EgressDenied; got < 4 {
		t.Errorf("p: %d refused connections counted, want 4 or more", got)
	}
	events := h.MustVmnetctl("events")
	for _, want := range []string{`(other.test): TLS names "other.test", which the policy does not allow`} {
		if !strings.Contains(events, want) {
			t.Errorf("events lack %q:\n%s", want, events)
		}
	}
}

// BenchmarkEgressNameCheck measures what the name check costs a TCP
// stream through the helper (issue 33's goal: under 5%), side by side in
// one run: each iteration moves the same bytes over HTTP from and to a
// server on the LAN, once from a VM whose network allows the server by
// prefix (the kernel's path: NAT alone) and once from a VM that reaches
// it by name (HTTP redirected through the proxy, its Host checked; HTTPS
// through the gate where the kernel queues packets, else the proxy),
// which first alternating, and reports both rates and their ratio.
//
//	sudo go test ./test/controller -run '^$' -bench EgressNameCheck -benchtime 20x
func BenchmarkEgressNameCheck(b *testing.B) {
	h := simvm.NewHost(b, "vmnbc", `
vmnet:
  byname:
    subnet: 10.84.0.0/24
    egress: {default: deny, allow: [api.test]}
  byaddr:
    subnet: 10.85.0.0/24
    egress: {default: deny, allow: [198.51.100.0/24]}
`, "pgrep")
	lan := testutil.NewNS(b, "nblan")
	testutil.Run(b, "ip", "-n", h.Name, "link", "add", "lan", "type", "veth", "peer", "name", "eth0", "netns", lan.Name)
	h.MustRun(b, "ip", "addr", "add", "198.51.100.1/24", "dev", "lan")
	h.MustRun(b, "ip", "link", "set", "lan", "up")
	lan.MustRun(b, "ip", "addr", "add", "198.51.100.2/24", "dev", "eth0")
	lan.MustRun(b, "ip", "link", "set", "eth0", "up")
	const size = 32 << 20
	blob := make([]byte, size)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			n, _ := io.Copy(io.Discard, r.Body)
			fmt.Fprint(w, n)
			return
		}
		// Of known length, as a file server sends a file (a body of
		// unknown length goes chunked, which the proxy copies).
		w.Header().Set("Content-Length", strconv.Itoa(size))
		w.Write(blob)
	})}
	go srv.Serve(lan.Listen(b, "tcp4", "198.51.100.2:80"))
	go srv.Serve(tls.NewListener(lan.Listen(b, "tcp4", "198.51.100.2:443"), testutil.TLSAnyName(b)))
	b.Cleanup(func() { srv.Close() })
	serveDNS(b, lan, "198.51.100.2:53", map[string]string{"api.test.": "198.51.100.2"})
	etc := filepath.Join("/etc/netns", h.Name)
	os.MkdirAll(etc, 0o755)
	b.Cleanup(func() { os.RemoveAll(etc) })
	if err := os.WriteFile(filepath.Join(etc, "resolv.conf"), []byte("nameserver 198.51.100.2\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	h.MustVmnetctl("up", "-f", h.WriteFile("vms.yaml", "vms:\n  n:\n    networks:\n      - vmnet: byname\n  a:\n    networks:\n      - vmnet: byaddr\n"))
	st := h.Status()
	byName, byAddr := h.VM(h.Attachment(st, "n")), h.VM(h.Attachment(st, "a"))
	byName.DHCP(b)
	byAddr.DHCP(b)
	if out, err := byName.Run(context.Background(), "busybox", "nslookup", "-type=a", "api.test", "10.84.0.1"); err != nil {
		b.Fatalf("resolving api.test: %v\n%s", err, out)
	}
	move := func(vm *simvm.VM, scheme string, up bool) time.Duration {
		var took time.Duration
		// The transport dials on goroutines of its own: each dial made
		// inside the VM's namespace, never the test's.
		c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true,
			TLSClientConfig: &tls.Config{ServerName: "api.test", InsecureSkipVerify: true},
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				var conn net.Conn
				err := vm.Do(func() (err error) {
					conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
					return err
				})
				return conn, err
			}}}
		err := func() error {
			start := time.Now()
			var resp *http.Response
			var err error
			// The server by its address, the request naming api.test.
			url := scheme + "://198.51.100.2/"
			req, _ := http.NewRequest(http.MethodGet, url, nil)
			if up {
				req, _ = http.NewRequest(http.MethodPost, url, bytes.NewReader(blob))
			}
			req.Host = "api.test"
			if resp, err = c.Do(req); err != nil {
				return err
			}
			defer resp.Body.Close()
			n, err := io.Copy(io.Discard, resp.Body)
			took = time.Since(start)
			if err == nil && (resp.StatusCode != http.StatusOK || !up && n != size) {
				err = fmt.Errorf("%s, %d bytes", resp.Status, n)
			}
			return err
		}()
		if err != nil {
			b.Fatalf("%s: %v", vm.Name, err)
		}
		return took
	}
	schemes := []string{"http", "https"}
	var took [2][2][2]time.Duration // [by name, by address][scheme][down, up]
	b.ResetTimer()
	for iter := range b.N {
		for j := range 2 {
			i := j ^ iter%2 // which goes first alternates
			vm := []*simvm.VM{byName, byAddr}[i]
			for k, scheme := range schemes {
				took[i][k][0] += move(vm, scheme, false)
				took[i][k][1] += move(vm, scheme, true)
			}
		}
	}
	rate := func(d time.Duration) float64 { return float64(b.N) * size * 8 / d.Seconds() / 1e9 }
	for k, scheme := range schemes {
		for j, dir := range []string{"down", "up"} {
			b.ReportMetric(rate(took[1][k][j]), "Gbit/s-"+scheme+"-address-"+dir)
			b.ReportMetric(rate(took[0][k][j]), "Gbit/s-"+scheme+"-name-"+dir)
			b.ReportMetric(rate(took[0][k][j])/rate(took[1][k][j]), scheme+"-name/address-"+dir)
		}
	}
}
