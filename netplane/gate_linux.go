package netplane

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"runtime"
	"slices"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/egressproxy"
	"github.com/vmnetctl/vmnetctl/flowgate"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/nfqueue"
)

// The name check's gate: a VM's TLS connections to the addresses its
// policy allows by name are not ended on the host (egressproxy) but go
// the kernel's forward path, marked pending in prerouting
// (nameCheckRedirects); their packets, both ways, go through a netfilter
// queue to the network's reader (flowgate, judging the ClientHello with
// egressproxy's own verdict, JudgeTLS) until it allows the connection,
// after which the kernel carries the rest alone; or refuses it, and the
// kernel resets it (nameGateRules). docs/performance.md, "The name
// check's cost", has why and what it holds against.

// queueKind is how this kernel queues a packet from nftables: its own
// queue statement (nft_queue), xtables' NFQUEUE target through nft_compat,
// or neither (the proxy checks TLS too).
type queueKind uint8

const (
	queueNone queueKind = iota
	queueNative
	queueXT
)

// kernelQueue probes, once, in a network namespace of its own (nothing
// of the host's is touched), which queue this kernel has, that a queue
// can be bound (nfnetlink_queue), and that the gate's rules load (the
// SYN's payload, @ih, needs Linux 5.16 or so).
var kernelQueue = sync.OnceValue(func() queueKind {
	got := make(chan queueKind, 1)
	go func() {
		// The thread never goes back to the runtime: it ends with this
		// goroutine, in the namespace it made.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			got <- queueNone
			return
		}
		q, err := nfqueue.Open(0, 0, 1)
		if err != nil {
			got <- queueNone
			return
		}
		q.Close()
		nft, err := hostnet.NFT(knftables.InetFamily, "probe")
		if err != nil {
			got <- queueNone
			return
		}
		tx := nft.NewTransaction()
		tx.Add(&knftables.Table{})
		tx.Add(&knftables.Chain{Name: NameQueueChain})
		tx.Add(&knftables.Chain{Name: NameGateChain})
		for _, r := range nameGateRules(`"vmn-probe"`) {
			tx.Add(&knftables.Rule{Chain: NameGateChain, Rule: r})
		}
		if nft.Run(context.Background(), tx) != nil {
			got <- queueNone
			return
		}
		for _, k := range []queueKind{queueNative, queueXT} {
			if writeQueueRule("probe", k, 0) == nil {
				got <- k
				return
			}
		}
		got <- queueNone
	}()
	return <-got
})

// nameGates reports whether network n's name check takes TLS through the
// gate: it checks names and the kernel queues.
func nameGates(n *api.Network) bool { return nameChecks(n) && kernelQueue() != queueNone }

// queueExprs is the queue statement of kind k for queue num; no bypass:
// with no reader bound, the packets are dropped.
func queueExprs(k queueKind, num uint16) []expr.Any {
	if k == queueNative {
		return []expr.Any{&expr.Queue{Num: num}}
	}
	// struct xt_NFQ_info_v1: the queue number, how many queues from it.
	info := xt.Unknown(binary.NativeEndian.AppendUint16(binary.NativeEndian.AppendUint16(nil, num), 1))
	return []expr.Any{&expr.Target{Name: "NFQUEUE", Rev: 1, Info: &info}}
}

// writeQueueRule makes NameQueueChain of network id's inet table (in the
// calling thread's namespace) hold one rule, which queues to num, in one
// transaction, once the network's reader has bound num (startGate): an
// empty chain makes the gate's chain drop. It makes the table and the
// chain if they are not there (the probe's, in its namespace of its
// own: a network's are ensureTable's).
func writeQueueRule(id string, k queueKind, num uint16) error {
	return withQueueChain(id, func(c *nftables.Conn, ch *nftables.Chain) error {
		c.AddTable(ch.Table)
		c.AddChain(ch)
		c.FlushChain(ch)
		c.AddRule(&nftables.Rule{Table: ch.Table, Chain: ch, Exprs: queueExprs(k, num)})
		return c.Flush()
	})
}

// withQueueChain calls f with a netlink connection (in the calling
// thread's namespace) and NameQueueChain of network id's inet table.
func withQueueChain(id string, f func(c *nftables.Conn, ch *nftables.Chain) error) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	defer c.CloseLasting()
	t := &nftables.Table{Name: hostnet.TableName(id), Family: nftables.TableFamilyINet}
	return f(c, &nftables.Chain{Name: NameQueueChain, Table: t})
}

// boundQueues are the queue numbers the networks' gates bound, by
// queueKey.
var boundQueues sync.Map

// queueKey is a network's in boundQueues: its id in the calling thread's
// namespace (a process may run networks of one name in several: tests).
type queueKey struct {
	ns hostnet.NetNS
	id string
}

func queueKeyOf(id string) queueKey {
	ns, _ := hostnet.ThreadNetNS()
	return queueKey{ns, id}
}

// emptyQueueChain takes the queue rule out of network id's table, if
// the table is there.
func emptyQueueChain(id string) error {
	return withQueueChain(id, func(c *nftables.Conn, ch *nftables.Chain) error {
		c.FlushChain(ch)
		return c.Flush()
	})
}

// checkQueueRule tells whether NameQueueChain of network id's table holds
// what it should: with the network's gate running, one rule, to its
// queue, with no bypass (which would accept what no reader takes);
// without, none (the gate's chain drops: no other program's reader, on
// a number the network once had, takes its packets).
func checkQueueRule(id string) error {
	var rules []*nftables.Rule
	if err := withQueueChain(id, func(c *nftables.Conn, ch *nftables.Chain) (err error) {
		rules, err = c.GetRules(ch.Table, ch)
		return err
	}); err != nil {
		return fmt.Errorf("reading chain %s: %w", NameQueueChain, err)
	}
	v, running := boundQueues.Load(queueKeyOf(id))
	if !running {
		if len(rules) != 0 {
			return fmt.Errorf("chain %s has %d rules, and no gate runs", NameQueueChain, len(rules))
		}
		return nil
	}
	num := v.(uint16)
	want := queueExprs(kernelQueue(), num)[0]
	queues := func(r *nftables.Rule) bool {
		if len(r.Exprs) != 1 {
			return false
		}
		switch e := r.Exprs[0].(type) {
		case *expr.Queue:
			w, ok := want.(*expr.Queue)
			return ok && e.Num == w.Num && e.Total <= 1 && e.Flag == 0
		case *expr.Target:
			w, ok := want.(*expr.Target)
			info, isUnknown := e.Info.(*xt.Unknown)
			// (The kernel gives the info back padded to 8 bytes.)
			return ok && isUnknown && e.Name == w.Name && e.Rev == w.Rev && bytes.HasPrefix(*info, *w.Info.(*xt.Unknown)) &&
				!slices.ContainsFunc((*info)[len(*w.Info.(*xt.Unknown)):], func(b byte) bool { return b != 0 })
		}
		return false
	}
	if len(rules) != 1 || !queues(rules[0]) {
		return fmt.Errorf("chain %s has %d rules, want the name check's queue to %d alone", NameQueueChain, len(rules), num)
	}
	return nil
}

// The gate's queue: its numbers are tried from one derived from the
// network's mark (its name and state dir), among queueSpan from
// queueBase, past those another program bound.
const (
	queueBase  = 0x7600
	queueSpan  = 1024
	queueTries = 64
	// queueLen bounds the packets waiting for a verdict (more are
	// dropped: the check fails closed, TCP sends them again).
	queueLen = 4096
	// gateMaxHeld is more than JudgeTLS reads before its verdict (a
	// ClientHello's 32 KiB, its records' headers): it refuses first.
	gateMaxHeld = 64 << 10
)

// queueNumber is the network's i-th queue number to try.
func queueNumber(id string, i int) uint16 {
	h := fnv.New32a()
	h.Write([]byte(hostnet.Mark(id)))
	return uint16(queueBase + (int(h.Sum32()%queueSpan)+i)%queueSpan)
}

// startGate binds the network's queue, points its queue rule at it, and
// judges its packets until Close.
func (nw *Network) startGate() error {
	n := nw.n
	var q *nfqueue.Queue
	var num uint16
	var bridge uint32
	err := nw.nsr.do(func() error {
		br, err := netlink.LinkByName(n.Bridge())
		if err != nil {
			return err
		}
		bridge = uint32(br.Attrs().Index)
		for i := range queueTries {
			num = queueNumber(n.ID, i)
			// Bound by another socket: EPERM (EBUSY on older kernels).
			if q, err = nfqueue.Open(num, 0xffff, queueLen); !errors.Is(err, unix.EPERM) && !errors.Is(err, unix.EBUSY) {
				break
			}
		}
		if err != nil {
			return err
		}
		key := queueKeyOf(n.ID)
		boundQueues.Store(key, num)
		nw.closers = append(nw.closers, func() error {
			// The rule goes with the reader (the table, and the gate's
			// chain that drops, stay: Remove's).
			nw.nsr.do(func() error { return emptyQueueChain(n.ID) })
			boundQueues.CompareAndDelete(key, num)
			return q.Close()
		})
		return writeQueueRule(n.ID, kernelQueue(), num)
	})
	if err != nil {
		return fmt.Errorf("network %q: the name check's queue: %w", n.ID, err)
	}
	judge := &egressproxy.Config{Allow: nw.nameAllowed, OuterECH: nw.outerECH, CheckDst: nw.outward}
	g := flowgate.New(flowgate.Config{
		Judge:        judge.JudgeTLS,
		Client:       nw.macOf,
		MaxConns:     egressproxy.MaxConns,
		MaxPerClient: egressproxy.MaxPerClient,
		MaxHeld:      gateMaxHeld,
		// A VM's held packets a sixteenth of the queue, all of them
		// half: the rest has room for the packets judged at once.
		MaxHeldPackets: queueLen / 16,
		MaxHeldAll:     queueLen / 2,
		Wait:           egressproxy.HelloWait,
	})
	nw.wg.Add(1)
	go func() {
		defer nw.wg.Done()
		err := flowgate.Serve(g, GateQueue(q, bridge), func(r flowgate.Refusal) {
			nw.nameRefused(r.Src, r.Dst, r.Name, r.Why)
		})
		if !nw.stopped() {
			nw.log.Error("the name check's gate stopped", "err", err)
			nw.fail(fmt.Errorf("network %q: the name check's gate stopped: %w", n.ID, err))
		}
	}()
	return nil
}

// GateQueue is queue q as a gate reads it: a packet that came in on the
// interface with index vmSide (a network's bridge) is a VM's, one that
// goes out on it the server's, and any other (another network's, queued
// to this number by mistake) is dropped; Allow, Refuse and Begin are the
// packet sent through its hook again with GateAllowMark, GateRefuseMark
// or GatePassMark (which NameGateChain takes).
func GateQueue(q *nfqueue.Queue, vmSide uint32) flowgate.Queue { return gateQueue{q, vmSide} }

type gateQueue struct {
	q      *nfqueue.Queue
	bridge uint32
}

func (g gateQueue) Receive() ([]flowgate.Queued, error) {
	ps, err := g.q.Receive()
	if errors.Is(err, unix.ENOBUFS) {
		// The socket was full: the kernel dropped what it could not
		// give (the senders send it again), nothing waits for a verdict.
		return nil, nil
	}
	out := make([]flowgate.Queued, 0, len(ps))
	for _, p := range ps {
		if p.InDev != g.bridge && p.OutDev != g.bridge {
			if verr := g.q.SetVerdict(p.ID, nfqueue.Drop, nil); verr != nil && err == nil {
				err = verr
			}
			continue
		}
		out = append(out, flowgate.Queued{ID: p.ID, Packet: p.Payload, FromVM: p.InDev == g.bridge})
	}
	return out, err
}

func (g gateQueue) Verdict(id uint32, a flowgate.Action) error {
	mark := func(m uint32) *uint32 { return &m }
	switch a {
	case flowgate.Accept:
		return g.q.SetVerdict(id, nfqueue.Accept, nil)
	case flowgate.Allow:
		return g.q.SetVerdict(id, nfqueue.Repeat, mark(GateAllowMark))
	case flowgate.Refuse:
		return g.q.SetVerdict(id, nfqueue.Repeat, mark(GateRefuseMark))
	case flowgate.Begin:
		return g.q.SetVerdict(id, nfqueue.Repeat, mark(GatePassMark))
	}
	return g.q.SetVerdict(id, nfqueue.Drop, nil)
}
