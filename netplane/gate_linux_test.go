package netplane

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/nfqueue"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestNameGate: where the kernel queues packets to user space, a VM's TLS
// to an address allowed by name goes through the network's gate: the
// allowed name's handshake completes, another name's never reaches the
// server; a SYN that carries bytes is dropped before it leaves the host
// (the gate judges a stream from its SYN-ACK on), a plain one goes on,
// and so is one sent on the ports of a connection allowed a moment ago
// (which conntrack takes for that connection's); the queue's rule is
// part of the table Check checks, and a network started again (a repair)
// puts it back, to another number if its own is taken.
func TestNameGate(t *testing.T) {
	needRoot(t)
	host := testutil.NewNS(t, "ng-host")
	w := wan(t, host)
	n := testNet("ng", api.ModeShared, "10.200.31.0/24")
	n.Egress = &api.Egress{Rules: []api.EgressRule{{Allow: true, Name: "api.test"}}}
	if !nameGates(n) {
		t.Skip("this kernel queues no packets to user space (nfnetlink_queue with nft_queue or nft_compat's NFQUEUE): the proxy checks TLS")
	}
	opts := Options{StateDir: t.TempDir(), Upstreams: []string{"127.0.0.1:53"}}
	nw := start(t, host, n, opts)
	check := func() error {
		return host.Do(func() error { return Check(context.Background(), n) })
	}
	if err := check(); err != nil {
		t.Fatalf("Check after Start: %v", err)
	}

	var mu sync.Mutex
	var heard []string
	cfg := testutil.TLSAnyName(t)
	cfg.GetConfigForClient = func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		mu.Lock()
		heard = append(heard, h.ServerName)
		mu.Unlock()
		return nil, nil
	}
	go testutil.ServeConns(tls.NewListener(w.Listen(t, "tcp4", wanPeer+":443"), cfg), func(c net.Conn) {
		if c.(*tls.Conn).Handshake() == nil {
			fmt.Fprintf(c, "hello %s\n", c.(*tls.Conn).ConnectionState().ServerName)
		}
	})
	// What reaches the WAN: SYNs to 443, counted.
	w.MustRun(t, "nft", "add table inet seen { chain in { type filter hook input priority 0; tcp dport 443 tcp flags syn / syn,ack counter; }; }")
	syns := func() int {
		out := w.MustRun(t, "nft", "list", "chain", "inet", "seen", "in")
		_, after, _ := strings.Cut(out, "counter packets ")
		v, _ := strconv.Atoi(strings.Fields(after + " x")[0])
		return v
	}

	v := vm(t, host, "ng", "52:55:55:00:31:01", n.Bridge(), false)
	vmAddr := netip.MustParseAddr(mustUdhcpc(t, v, "")["ip"])
	resolved := func(nw *Network) {
		nw.learnNames(vmAddr, "api.test.", []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: "api.test.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300},
			A: net.ParseIP(wanPeer)}})
	}
	resolved(nw)
	hello := func(name string) (string, error) {
		var line string
		err := v.Do(func() error {
			c, err := net.DialTimeout("tcp4", wanPeer+":443", 10*time.Second)
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(30 * time.Second))
			line, err = bufio.NewReader(tls.Client(c, &tls.Config{ServerName: name, InsecureSkipVerify: true})).ReadString('\n')
			return err
		})
		return strings.TrimSpace(line), err
	}
	if got, err := hello("api.test"); got != "hello api.test" {
		t.Fatalf("the allowed name: %q, %v", got, err)
	}
	// An allowed connection, left open: its conntrack entry is marked
	// allowed.
	var open net.Conn
	v.MustDo(t, func() error {
		c, err := net.DialTimeout("tcp4", wanPeer+":443", 10*time.Second)
		if err != nil {
			return err
		}
		tc := tls.Client(c, &tls.Config{ServerName: "api.test", InsecureSkipVerify: true})
		open = tc
		_, err = bufio.NewReader(tc).ReadString('\n')
		return err
	})
	defer open.Close()
	if got, err := hello("other.test"); err == nil {
		t.Errorf("another name: %q", got)
	}
	mu.Lock()
	if strings.Contains(strings.Join(heard, ","), "other.test") {
		t.Errorf("the server heard %q", heard)
	}
	mu.Unlock()

	// SYNs written raw: one with bytes (TCP Fast Open's place for the
	// first flight), then a plain one, the control.
	before := syns()
	dst := netip.AddrPortFrom(netip.MustParseAddr(wanPeer), 443)
	sendRaw(t, v, synPacket(netip.AddrPortFrom(vmAddr, 40001), dst, []byte("\x16\x03\x01 a ClientHello's first bytes")))
	sendRaw(t, v, synPacket(open.LocalAddr().(*net.TCPAddr).AddrPort(), dst, []byte("\x16\x03\x01 on an allowed one's ports")))
	sendRaw(t, v, synPacket(netip.AddrPortFrom(vmAddr, 40002), dst, nil))
	testutil.Eventually(t, 10*time.Second, func() error {
		if got := syns(); got <= before {
			return fmt.Errorf("%d SYNs to 443 reached the WAN since", got-before)
		}
		return nil
	}, "the plain SYN")
	if got := syns() - before; got != 1 {
		t.Errorf("%d SYNs reached the WAN, want the plain one alone", got)
	}

	// The queue's rule gone: Check says so, and the network started again
	// puts it back.
	host.MustRun(t, "nft", "flush", "chain", "inet", hostnet.TableName(n.ID), NameQueueChain)
	if err := check(); err == nil || !strings.Contains(err.Error(), NameQueueChain) {
		t.Errorf("Check with the queue's rule gone: %v", err)
	}
	nw.Close()
	var taken *nfqueue.Queue // another program's, on the network's first number
	host.MustDo(t, func() (err error) {
		taken, err = nfqueue.Open(queueNumber(n.ID, 0), 0xffff, 16)
		return err
	})
	defer taken.Close()
	resolved(start(t, host, n, opts)) // (the names it learned are learned again)
	if err := check(); err != nil {
		t.Errorf("Check after a restart: %v", err)
	}
	if got, err := hello("api.test"); got != "hello api.test" {
		t.Errorf("the allowed name after a restart: %q, %v", got, err)
	}
}

// synPacket is an IPv4 TCP SYN from src to dst carrying payload, its
// checksums right (the kernel fills in the IP header's).
func synPacket(src, dst netip.AddrPort, payload []byte) []byte {
	tcp := make([]byte, 20, 20+len(payload))
	binary.BigEndian.PutUint16(tcp[0:], src.Port())
	binary.BigEndian.PutUint16(tcp[2:], dst.Port())
	binary.BigEndian.PutUint32(tcp[4:], 7777)
	tcp[12], tcp[13] = 5<<4, 0x02
	binary.BigEndian.PutUint16(tcp[14:], 64240)
	tcp = append(tcp, payload...)
	s, d := src.Addr().As4(), dst.Addr().As4()
	var sum uint32
	add := func(b []byte) {
		for i := 0; i+1 < len(b); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(b[i:]))
		}
		if len(b)%2 == 1 {
			sum += uint32(b[len(b)-1]) << 8
		}
	}
	add(s[:])
	add(d[:])
	sum += unix.IPPROTO_TCP + uint32(len(tcp))
	add(tcp)
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	binary.BigEndian.PutUint16(tcp[16:], ^uint16(sum))
	ip := make([]byte, 20)
	ip[0], ip[8], ip[9] = 0x45, 64, unix.IPPROTO_TCP
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(tcp)))
	copy(ip[12:], s[:])
	copy(ip[16:], d[:])
	return append(ip, tcp...)
}

// sendRaw sends IPv4 packet pkt, header and all, from namespace n.
func sendRaw(t *testing.T, n *testutil.NS, pkt []byte) {
	t.Helper()
	n.MustDo(t, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Sendto(fd, pkt, 0, &unix.SockaddrInet4{Addr: [4]byte(pkt[16:20])})
	})
}

// TestNameGateRules: with the gate, a name-checked connection to 443 is
// marked pending in prerouting, not redirected; 80 still is; the forward
// chain sends the marked connections both ways to the gate's chain after
// the rule between the VMs, before the egress policy.
func TestNameGateRules(t *testing.T) {
	n := testNet("s", api.ModeShared, "10.9.0.0/24")
	n.Egress = &api.Egress{Rules: []api.EgressRule{{Allow: true, Name: "api.test"}}}
	r := nftRules(n, true)
	pre := strings.Join(r["prerouting"], "\n")
	for _, want := range []string{
		`iifname "vmn-s" ip saddr != @egress-own4 ip daddr @egress-names4 tcp dport 443 ct mark set ct mark & 0xfdffffff | 0x01000000`,
		`iifname "vmn-s" ip saddr != @egress-own4 ip daddr @egress-names4 tcp dport 80 redirect to :tcp dport map @egress-proxy4`,
		`iifname "vmn-s" ip6 saddr @egress-own6 ip6 saddr . ip6 daddr @egress-vmnames6 tcp dport 443 ct mark set ct mark & 0xfdffffff | 0x01000000`,
	} {
		if !strings.Contains(pre, want+"\n") {
			t.Errorf("prerouting lacks %q:\n%s", want, pre)
		}
	}
	if strings.Contains(pre, "{ 80, 443 }") {
		t.Errorf("prerouting redirects 443 to the proxy:\n%s", pre)
	}
	fwd := r["forward"]
	at := func(rule string) int { return slices.Index(fwd, rule) }
	jump := `iifname "vmn-s" ct mark & 0x03000000 != 0x00000000 jump name-gate`
	if between, gate, policy := at(`iifname "vmn-s" oifname "vmn-s" accept`), at(jump), at(`iifname "vmn-s" ct state != { established, related } ip daddr @egress-nonames4 goto egress-denied`); between < 0 || gate != between+1 || policy < gate ||
		at(`oifname "vmn-s" ct mark & 0x03000000 != 0x00000000 jump name-gate`) != gate+1 {
		t.Errorf("forward chain:\n%s", strings.Join(fwd, "\n"))
	}
	if len(r[NameGateChain]) == 0 || r[NameGateChain][len(r[NameGateChain])-1] != "drop" {
		t.Errorf("the gate's chain does not end in a drop: %q", r[NameGateChain])
	}
	if _, ok := nftRules(n, false)[NameGateChain]; ok {
		t.Error("a gate chain without the gate")
	}
}
