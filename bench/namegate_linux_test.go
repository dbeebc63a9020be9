package bench

import (
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/egressproxy"
	"github.com/vmnetctl/vmnetctl/flowgate"
	"github.com/vmnetctl/vmnetctl/netplane"
	"github.com/vmnetctl/vmnetctl/nfqueue"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// The name check in the kernel's path, tried end to end before it is
// wired into a network (issue 33): a VM namespace, a router namespace
// that forwards (conntrack, the rules below, the queue's reader with
// flowgate and egressproxy.JudgeTLS), a server namespace with a TLS
// server that shows any name.
//
//	vm 10.77.1.2 ── veth ── 10.77.1.1 router 10.77.2.1 ── veth ── 10.77.2.2 srv
//
// The router's forward chain, in order: a packet the reader repeated
// with the allow mark (netplane.GateQueue's, as a network's) marks its
// connection allowed (ct mark) and is accepted, one with the refuse
// mark marks it refused and is dropped;
// an allowed connection is accepted, a refused one dropped; a new TCP
// connection from the VM to port 443 is marked pending; a pending one's
// packets, both ways, go to the queue.
const (
	gateQueue   = 11
	ctAllowed   = 1
	ctRefused   = 2
	ctPending   = 3
	gateName    = "api.test"
	gateVMAddr  = "10.77.1.2"
	gateSrvAddr = "10.77.2.2"
)

// TestNameGatePath: through the gate, a TLS connection that names an
// allowed name gets its answer; one that names another is refused before
// a byte of it reaches the server; and, with VMNETCTL_BENCH=gate, the
// throughput of a download and an upload through the gate, side by side
// with the same path without it.
func TestNameGatePath(t *testing.T) {
	testutil.RequireRoot(t, "makes namespaces, rules and a queue")
	vmNS, router, srv := testutil.NewNS(t, "gate-vm"), testutil.NewNS(t, "gate-rt"), testutil.NewNS(t, "gate-srv")
	veth := func(a *testutil.NS, aName, aAddr string, b *testutil.NS, bName, bAddr string) {
		testutil.Run(t, "ip", "link", "add", aName, "netns", a.Name, "type", "veth", "peer", "name", bName, "netns", b.Name)
		a.MustRun(t, "ip", "addr", "add", aAddr, "dev", aName)
		b.MustRun(t, "ip", "addr", "add", bAddr, "dev", bName)
		a.MustRun(t, "ip", "link", "set", aName, "up")
		b.MustRun(t, "ip", "link", "set", bName, "up")
	}
	veth(vmNS, "eth0", gateVMAddr+"/24", router, "to-vm", "10.77.1.1/24")
	veth(router, "to-srv", "10.77.2.1/24", srv, "eth0", gateSrvAddr+"/24")
	vmNS.MustRun(t, "ip", "route", "add", "default", "via", "10.77.1.1")
	srv.MustRun(t, "ip", "route", "add", "default", "via", "10.77.2.1")
	router.MustRun(t, "sysctl", "-qw", "net.ipv4.ip_forward=1")

	// The server: each connection's first byte says what it wants: 'd'
	// a download of the rest of its count, 'u' an upload.
	var heard sync.Map // names the server's handshakes saw
	srvCfg := testutil.TLSAnyName(t)
	srvCfg.GetConfigForClient = func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		heard.Store(h.ServerName, true)
		return nil, nil
	}
	ln := srv.Listen(t, "tcp4", gateSrvAddr+":443")
	go serveGate(tls.NewListener(ln, srvCfg))

	var q *nfqueue.Queue
	router.MustDo(t, func() error {
		if err := gateRules(true); err != nil {
			return err
		}
		var err error
		q, err = nfqueue.Open(gateQueue, 0xffff, 4096)
		return err
	})
	t.Cleanup(func() { q.Close() })
	judge := &egressproxy.Config{Allow: func(_, _ netip.AddrPort, name string) bool { return name == gateName }}
	g := flowgate.New(flowgate.Config{Judge: judge.JudgeTLS, MaxConns: 1024, MaxPerClient: 256, MaxHeld: 32 << 10, Wait: 30 * time.Second})
	var refusals []flowgate.Refusal
	var mu sync.Mutex
	var vmSide uint32 // the router's interface towards the VM
	router.MustDo(t, func() error {
		i, err := net.InterfaceByName("to-vm")
		if err == nil {
			vmSide = uint32(i.Index)
		}
		return err
	})
	go flowgate.Serve(g, netplane.GateQueue(q, vmSide), func(r flowgate.Refusal) {
		mu.Lock()
		refusals = append(refusals, r)
		mu.Unlock()
	})

	// wait, if not zero, bounds a handshake that must not complete (a
	// refused connection's packets are dropped: the product resets it).
	dial := func(name string, wait time.Duration) (*tls.Conn, error) {
		var c *tls.Conn
		err := vmNS.Do(func() error {
			raw, err := net.DialTimeout("tcp4", gateSrvAddr+":443", 10*time.Second)
			if err != nil {
				return err
			}
			c = tls.Client(raw, &tls.Config{ServerName: name, InsecureSkipVerify: true})
			return nil
		})
		if err != nil {
			return nil, err
		}
		if wait > 0 {
			c.SetDeadline(time.Now().Add(wait))
		}
		if err := c.Handshake(); err != nil {
			c.Close()
			return nil, err
		}
		c.SetDeadline(time.Time{})
		return c, nil
	}
	c, err := dial(gateName, 0)
	if err != nil {
		t.Fatalf("the allowed name: %v", err)
	}
	if n, err := transfer(c, 'd', 1<<20); err != nil || n != 1<<20 {
		t.Errorf("the allowed name: %d bytes, %v", n, err)
	}
	c.Close()
	if _, err := dial("evil.test", 2*time.Second); err == nil {
		t.Error("another name: the handshake went through")
	}
	if _, ok := heard.Load("evil.test"); ok {
		t.Error("the server heard the refused name")
	}
	mu.Lock()
	if len(refusals) != 1 || refusals[0].Name != "evil.test" {
		t.Errorf("refusals %+v", refusals)
	}
	mu.Unlock()

	if os.Getenv("VMNETCTL_BENCH") != "gate" {
		return
	}
	const size = 2 << 30
	measure := func(what byte) float64 {
		c, err := dial(gateName, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		began := time.Now()
		n, err := transfer(c, what, size)
		if err != nil {
			t.Fatal(err)
		}
		return float64(n) * 8 / time.Since(began).Seconds() / 1e9
	}
	for round := range 4 {
		for _, what := range []byte{'d', 'u'} {
			// Which goes first alternates, round by round.
			var gated, plain float64
			for _, gate := range []bool{round%2 == 0, round%2 != 0} {
				router.MustDo(t, func() error { return gateRules(gate) })
				if v := measure(what); gate {
					gated = v
				} else {
					plain = v
				}
			}
			t.Logf("round %d, %c: through the gate %.2f Gbit/s, the kernel's path alone %.2f: %.3f", round, what, gated, plain, gated/plain)
		}
	}
}

// transfer asks the server for a download ('d') or an upload ('u') of n
// bytes over c and moves them.
func transfer(c *tls.Conn, what byte, n int64) (int64, error) {
	hdr := []byte{what, 0, 0, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint64(hdr[1:], uint64(n))
	if _, err := c.Write(hdr); err != nil {
		return 0, err
	}
	if what == 'd' {
		return io.Copy(io.Discard, io.LimitReader(c, n))
	}
	m, err := io.CopyN(c, zeros{}, n)
	if err != nil {
		return m, err
	}
	var ack [1]byte
	_, err = io.ReadFull(c, ack[:]) // the server read it all
	return m, err
}

type zeros struct{}

func (zeros) Read(b []byte) (int, error) {
	clear(b)
	return len(b), nil
}

// serveGate serves transfer's requests.
func serveGate(ln net.Listener) {
	testutil.ServeConns(ln, func(c net.Conn) {
		hdr := make([]byte, 9)
		if _, err := io.ReadFull(c, hdr); err != nil {
			return
		}
		n := int64(binary.BigEndian.Uint64(hdr[1:]))
		if hdr[0] == 'd' {
			io.CopyN(c, zeros{}, n)
			return
		}
		if _, err := io.CopyN(io.Discard, c, n); err == nil {
			c.Write([]byte{1})
		}
	})
}

// gateRules makes the router's table, with the gate's rules or (on
// false) an empty forward chain: the kernel's path alone.
func gateRules(gated bool) error {
	c := &nftables.Conn{}
	tbl := &nftables.Table{Name: "gate", Family: nftables.TableFamilyIPv4}
	c.DelTable(tbl)
	c.Flush() // (none yet, the first time)
	c.AddTable(tbl)
	ch := c.AddChain(&nftables.Chain{Name: "forward", Table: tbl, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter})
	if !gated {
		return c.Flush()
	}
	u32 := func(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }
	metaMark := func(v uint32) []expr.Any {
		return []expr.Any{&expr.Meta{Key: expr.MetaKeyMARK, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: u32(v)}}
	}
	ctMark := func(v uint32) []expr.Any {
		return []expr.Any{&expr.Ct{Key: expr.CtKeyMARK, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: u32(v)}}
	}
	setCtMark := func(v uint32) []expr.Any {
		return []expr.Any{&expr.Immediate{Register: 1, Data: u32(v)}, &expr.Ct{Key: expr.CtKeyMARK, Register: 1, SourceRegister: true}}
	}
	accept, drop := &expr.Verdict{Kind: expr.VerdictAccept}, &expr.Verdict{Kind: expr.VerdictDrop}
	info := xt.Unknown(binary.NativeEndian.AppendUint16(binary.NativeEndian.AppendUint16(nil, gateQueue), 1))
	rule := func(e ...[]expr.Any) {
		var all []expr.Any
		for _, x := range e {
			all = append(all, x...)
		}
		c.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: all})
	}
	rule(metaMark(netplane.GatePassMark), []expr.Any{accept}) // a SYN-ACK the gate follows from (pending already)
	rule(metaMark(netplane.GateAllowMark), setCtMark(ctAllowed), []expr.Any{accept})
	rule(metaMark(netplane.GateRefuseMark), setCtMark(ctRefused), []expr.Any{drop})
	rule(ctMark(ctAllowed), []expr.Any{accept})
	rule(ctMark(ctRefused), []expr.Any{drop})
	rule([]expr.Any{
		&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: u32(expr.CtStateBitNEW), Xor: u32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: u32(0)},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, 443)},
	}, setCtMark(ctPending))
	rule(ctMark(ctPending), []expr.Any{&expr.Target{Name: "NFQUEUE", Rev: 1, Info: &info}})
	if err := c.Flush(); err != nil {
		return errors.Join(errors.New("the gate's rules"), err)
	}
	return nil
}
