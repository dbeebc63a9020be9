// Package flowgate judges TCP connections on their first bytes from the
// packets a netfilter queue gives it (package nfqueue), so that the
// kernel's forward path carries the rest of a connection it allows: the
// name check of egress policies (issue 33) without a proxy in the path of
// every byte.
//
// A proxy that ends the connection only ever writes to the server bytes
// it judged. A gate in the path must make the server see the same, and
// holds against what a hostile guest can send (docs/performance.md, "The
// name check's cost"):
//
//   - The server's SYN-ACK gives the initial sequence number of the
//     guest's SYN it took (its acknowledgement number, one past it): the
//     judged bytes are the stream's first, contiguous from there. A
//     segment past a hole is dropped; one that overlaps bytes held or
//     judged with other bytes refuses the connection, and so does one
//     that sends held bytes again: nothing reaches the server before the
//     verdict, so no acknowledgement comes, and a sender that sends again
//     what it sent will not send the rest (its first message is past its
//     window, or a segment was lost). The guest's SYN itself need not
//     be queued (a netfilter queue drops a new connection's first packet
//     when the host has a copy of it elsewhere, as a packet socket on a
//     bridge with br_netfilter does), but may carry no bytes: one that
//     does is refused (TCP Fast Open is not judged).
//   - Judged bytes may die after the host and be sent again: until the
//     server has acknowledged every one of them, the guest's segments
//     stay queued and are compared; only then is the connection allowed
//     (Allow: its later packets need no queue).
//   - A connection whose SYN-ACK the gate did not see, one that sends more
//     than MaxHeld before a verdict, or takes longer than Wait, is
//     refused. Connections waiting are bounded per client and in all: a
//     SYN past the bounds is dropped.
//
// It imports nothing of vmnetctl: the verdict on the bytes (Config.Judge)
// and the name of a client are the caller's.
package flowgate

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"
)

// Action is what becomes of a queued packet.
type Action uint8

const (
	// Hold: no verdict yet; the packet's comes in a later Verdict.
	Hold Action = iota
	// Accept: let it go on; the connection's packets are still queued.
	Accept
	// Drop: drop it; the connection's packets are still queued.
	Drop
	// Allow: let it go on, and the connection is allowed: its packets
	// need no queue from now on (the caller marks it so).
	Allow
	// Refuse: drop it, and the connection is refused (the caller marks
	// it so, and resets it).
	Refuse
	// Begin: let it go on, and the connection is followed from it (the
	// server's SYN-ACK): the caller marks it pending again, after any
	// verdict on an earlier connection on the same ports it applied
	// since the packet came (an Allow given to that one must not stand
	// for this one).
	Begin
)

func (a Action) String() string {
	return [...]string{"hold", "accept", "drop", "allow", "refuse", "begin"}[a]
}

// Verdict is the action on queued packet ID.
type Verdict struct {
	ID     uint32
	Action Action
}

// Refusal is a connection refused: the VM's end, the server's, the name
// it asked for ("" if none) and why.
type Refusal struct {
	Src, Dst netip.AddrPort
	Name     string
	Why      string
}

// Config is a gate's verdict and bounds.
type Config struct {
	// Judge judges a connection from src to dst on its first bytes:
	// more while they do not yet tell (egressproxy.Config.JudgeTLS), then
	// the name they ask for and why the connection is refused ("" if it
	// is not).
	Judge func(first []byte, src, dst netip.AddrPort) (more bool, name, why string)
	// Client names the VM that sends from src, for MaxPerClient; nil for
	// the address itself.
	Client func(src netip.Addr) string
	// MaxConns bounds the connections the gate follows (waiting for a
	// verdict or for the server's acknowledgement, or refused a moment
	// ago), MaxPerClient a client's share.
	MaxConns, MaxPerClient int
	// MaxHeld bounds the bytes a connection may send before its verdict.
	MaxHeld int
	// MaxHeldPackets bounds the packets a client's connections hold
	// waiting for verdicts, MaxHeldAll those of all clients (0: no
	// bound): a queue's own length is a bound on all its packets, and
	// one client must not fill it for the others.
	MaxHeldPackets, MaxHeldAll int
	// Wait bounds how long a connection may take from its SYN to being
	// allowed.
	Wait time.Duration
}

// maxSegments bounds the segments a connection's bytes are held in
// before the verdict: a ClientHello takes a few (a 32 KiB one 62 at an
// MSS of 536); each is judged again with the bytes before it.
const maxSegments = 128

// allowedLinger is how long an allowed connection is remembered: its
// packets queued before the kernel took the allow mark are let go, not
// taken for a connection whose start the gate did not see.
const allowedLinger = 2 * time.Second

// Gate follows the connections of one queue. It is not safe for use by
// several goroutines at once.
type Gate struct {
	cfg       Config
	conns     map[connKey]*conn
	perClient map[string]int
	heldBy    map[string]int // packets held, by client
	heldAll   int
}

// New returns a gate judging with cfg.
func New(cfg Config) *Gate {
	return &Gate{cfg: cfg, conns: map[connKey]*conn{}, perClient: map[string]int{}, heldBy: map[string]int{}}
}

// connKey is a connection as the VM sends it: its end, the server's.
type connKey struct{ vm, server netip.AddrPort }

type state uint8

const (
	judging   state = iota // its bytes held until the verdict
	verifying              // allowed bytes not yet acknowledged by the server
	refused                // refused: what comes late is dropped
	allowed                // allowed a moment ago: what comes late goes on
)

type conn struct {
	state  state
	isn    uint32 // the VM's initial sequence number
	since  time.Time
	client string
	buf    []byte   // the stream's first bytes: held, then judged (compared until acknowledged)
	held   []uint32 // the ids of the packets held, in order
}

// Conns is how many connections the gate follows.
func (g *Gate) Conns() int { return len(g.conns) }

// Packet takes queued packet id, an IPv4 or IPv6 packet, from the VM or
// to it, at now: the verdicts it makes (on it and on packets held
// before), and the connection it refused, if it did. A packet that is no
// TCP segment whole in its packet is dropped.
func (g *Gate) Packet(id uint32, pkt []byte, fromVM bool, now time.Time) ([]Verdict, *Refusal) {
	s, ok := parse(pkt)
	if !ok {
		return []Verdict{{id, Drop}}, nil
	}
	if fromVM {
		return g.fromVM(id, s)
	}
	return g.toVM(id, s, now)
}

func (g *Gate) fromVM(id uint32, s segment) ([]Verdict, *Refusal) {
	k := connKey{s.src, s.dst}
	c := g.conns[k]
	switch {
	case s.flags&flagRST != 0 && len(s.payload) != 0:
		return []Verdict{{id, Drop}}, nil // bytes no stack should take
	case s.flags&flagRST != 0:
		out := g.end(k, c)
		return append(out, Verdict{id, Accept}), nil
	case s.flags&flagSYN != 0:
		switch {
		case len(s.payload) != 0:
			out := g.end(k, c)
			return append(out, Verdict{id, Refuse}), &Refusal{Src: s.src, Dst: s.dst, Why: "it sent bytes in its SYN"}
		case c != nil && c.isn != s.seq:
			return append(g.end(k, c), Verdict{id, Accept}), nil // a new connection on the same ports
		case c != nil && c.state == refused:
			return []Verdict{{id, Refuse}}, nil
		}
		return []Verdict{{id, Accept}}, nil
	case c != nil && c.state == refused:
		return []Verdict{{id, Refuse}}, nil
	case c != nil && c.state == allowed:
		return []Verdict{{id, Accept}}, nil
	case s.flags&flagURG != 0:
		// A server's stack takes the urgent byte out of the stream its
		// reader reads: what it reads would not be what was judged.
		if c == nil {
			return []Verdict{{id, Refuse}}, &Refusal{Src: s.src, Dst: s.dst, Why: "it set the urgent pointer"}
		}
		return g.refuse(k, c, id, true, "", "it set the urgent pointer")
	case c == nil:
		if len(s.payload) == 0 && s.flags&flagFIN == 0 {
			return []Verdict{{id, Accept}}, nil
		}
		// Bytes of a connection whose start was not seen: what came
		// before them cannot be known.
		return []Verdict{{id, Refuse}}, &Refusal{Src: s.src, Dst: s.dst, Why: "its start was not seen"}
	case len(s.payload) == 0:
		return []Verdict{{id, Accept}}, nil
	}
	return g.data(k, c, id, s)
}

// data takes a segment of the VM's with bytes.
func (g *Gate) data(k connKey, c *conn, id uint32, s segment) ([]Verdict, *Refusal) {
	off := int64(int32(s.seq - (c.isn + 1)))
	if off < 0 {
		return []Verdict{{id, Drop}}, nil // before the stream began
	}
	if off > int64(len(c.buf)) {
		return []Verdict{{id, Drop}}, nil // past a hole, or past the judged bytes: sent again later
	}
	overlap := min(int64(len(s.payload)), int64(len(c.buf))-off)
	if !bytes.Equal(s.payload[:overlap], c.buf[off:off+overlap]) {
		return g.refuse(k, c, id, true, "", "it sent other bytes in place of those it sent before")
	}
	if c.state == verifying {
		if overlap < int64(len(s.payload)) {
			// Bytes past the judged ones wait for the server's
			// acknowledgement of these (then the connection is allowed,
			// and the VM sends them again): the server acknowledges
			// nothing past the judged bytes before.
			return []Verdict{{id, Drop}}, nil
		}
		return []Verdict{{id, Accept}}, nil
	}
	if overlap == int64(len(s.payload)) {
		// Held bytes sent again: the sender had no acknowledgement, nor
		// will it have one before the verdict, and the bytes that would
		// tell do not come (past its window, or lost): refused now
		// rather than at Wait (the client may try again).
		return g.refuse(k, c, id, true, "", "it sent held bytes again before they were whole (more than its window, or lost)")
	}
	if len(c.buf)+len(s.payload)-int(overlap) > g.cfg.MaxHeld || len(c.held) >= maxSegments {
		return g.refuse(k, c, id, true, "", "it sent more than the check reads before a verdict")
	}
	if g.cfg.MaxHeldPackets > 0 && g.heldBy[c.client] >= g.cfg.MaxHeldPackets || g.cfg.MaxHeldAll > 0 && g.heldAll >= g.cfg.MaxHeldAll {
		return g.refuse(k, c, id, true, "", "too many of its packets wait for the name check")
	}
	c.buf = append(c.buf, s.payload[overlap:]...)
	c.held = append(c.held, id)
	g.heldBy[c.client]++
	g.heldAll++
	more, name, why := g.cfg.Judge(c.buf, k.vm, k.server)
	switch {
	case more:
		return []Verdict{{id, Hold}}, nil
	case why != "":
		return g.refuse(k, c, id, true, name, why)
	}
	out := make([]Verdict, 0, len(c.held))
	for _, h := range c.held {
		out = append(out, Verdict{h, Accept})
	}
	g.release(c)
	c.state = verifying
	return out, nil
}

// release forgets c's held packets (their verdicts given).
func (g *Gate) release(c *conn) {
	if len(c.held) == 0 {
		return
	}
	g.heldAll -= len(c.held)
	if g.heldBy[c.client] -= len(c.held); g.heldBy[c.client] <= 0 {
		delete(g.heldBy, c.client)
	}
	c.held = nil
}

// toVM takes a segment of the server's: its SYN-ACK starts following
// the connection, an acknowledgement of every judged byte allows it.
func (g *Gate) toVM(id uint32, s segment, now time.Time) ([]Verdict, *Refusal) {
	k := connKey{s.dst, s.src}
	c := g.conns[k]
	switch {
	case s.flags&(flagSYN|flagACK|flagRST) == flagSYN|flagACK:
		return g.synAck(k, c, id, s.ack-1, now)
	case c != nil && c.state == refused:
		return []Verdict{{id, Refuse}}, nil
	case s.flags&flagRST != 0:
		return append(g.end(k, c), Verdict{id, Accept}), nil
	case c != nil && c.state == verifying && s.flags&flagACK != 0 && acksJudged(s.ack-(c.isn+1)-uint32(len(c.buf))):
		c.state, c.since, c.buf = allowed, now, nil
		return []Verdict{{id, Allow}}, nil
	}
	return []Verdict{{id, Accept}}, nil
}

// acksJudged reports whether an acknowledgement past the judged bytes by
// d acknowledges them all and no more (but the VM's FIN): the server took
// the stream the gate judged, not another (a second SYN's, answered
// with a cookie, whose numbers lie elsewhere).
func acksJudged(d uint32) bool { return d <= 1 }

// synAck takes the server's SYN-ACK, which acknowledges the VM's SYN
// with initial sequence number isn.
func (g *Gate) synAck(k connKey, c *conn, id, isn uint32, now time.Time) ([]Verdict, *Refusal) {
	var out []Verdict
	switch {
	case c != nil && c.isn == isn && c.state == refused:
		return []Verdict{{id, Refuse}}, nil
	case c != nil && c.isn == isn && c.state != allowed:
		// Again. (A server sends no SYN-ACK once it acknowledged the
		// judged bytes: one after Allow is another connection on the
		// same ports, whatever its ISN.)
		return []Verdict{{id, Accept}}, nil
	case c != nil && (c.state == judging || c.state == verifying):
		// Another SYN taken (a server with SYN cookies answers each): the
		// stream the server takes may not be the one judged.
		return g.refuse(k, c, id, true, "", "the server took two SYNs of its")
	case c != nil:
		// A connection refused or allowed before on the same ports: this
		// is another (the kernel marked it pending again).
		out = g.end(k, c)
	}
	client := g.client(k.vm.Addr())
	if len(g.conns) >= g.cfg.MaxConns || g.perClient[client] >= g.cfg.MaxPerClient {
		return append(out, Verdict{id, Refuse}), &Refusal{Src: k.vm, Dst: k.server, Why: "too many of its connections wait for the name check"}
	}
	g.conns[k] = &conn{isn: isn, since: now, client: client}
	g.perClient[client]++
	return append(out, Verdict{id, Begin}), nil
}

// refuse refuses connection k: its held packets dropped, the packet that
// tipped it (tip, if hasTip; else the last held, if any) refused, and
// the connection kept as refused until it expires.
func (g *Gate) refuse(k connKey, c *conn, tip uint32, hasTip bool, name, why string) ([]Verdict, *Refusal) {
	if !hasTip && len(c.held) > 0 {
		tip, hasTip = c.held[len(c.held)-1], true
	}
	out := make([]Verdict, 0, len(c.held)+1)
	for _, h := range c.held {
		if !hasTip || h != tip {
			out = append(out, Verdict{h, Drop})
		}
	}
	if hasTip {
		out = append(out, Verdict{tip, Refuse})
	}
	g.release(c)
	c.state, c.buf = refused, nil
	return out, &Refusal{Src: k.vm, Dst: k.server, Name: name, Why: why}
}

// end forgets connection k (c, if not nil), its held packets dropped.
func (g *Gate) end(k connKey, c *conn) []Verdict {
	if c == nil {
		return nil
	}
	var out []Verdict
	for _, h := range c.held {
		out = append(out, Verdict{h, Drop})
	}
	g.release(c)
	delete(g.conns, k)
	if g.perClient[c.client]--; g.perClient[c.client] <= 0 {
		delete(g.perClient, c.client)
	}
	return out
}

// Expire refuses the connections that took longer than Wait since their
// SYN-ACK (their held packets refused, the last with the mark), and
// forgets those refused longer ago than that and those allowed longer
// ago than allowedLinger.
func (g *Gate) Expire(now time.Time) ([]Verdict, []Refusal) {
	var out []Verdict
	var refusals []Refusal
	for k, c := range g.conns {
		switch age := now.Sub(c.since); {
		case c.state == allowed && age >= allowedLinger, c.state == refused && age >= g.cfg.Wait:
			g.end(k, c)
			continue
		case age < g.cfg.Wait || c.state == allowed || c.state == refused:
			continue
		}
		v, r := g.refuse(k, c, 0, false, "", "it was not allowed within "+g.cfg.Wait.String())
		c.since = now // a refused connection is remembered for Wait
		out = append(out, v...)
		refusals = append(refusals, *r)
	}
	return out, refusals
}

func (g *Gate) client(a netip.Addr) string {
	if g.cfg.Client != nil {
		if c := g.cfg.Client(a); c != "" {
			return c
		}
	}
	return a.String()
}

// TCP's flags.
const (
	flagFIN = 0x01
	flagSYN = 0x02
	flagRST = 0x04
	flagACK = 0x10
	flagURG = 0x20
)

// segment is what the gate reads of a TCP segment.
type segment struct {
	src, dst netip.AddrPort
	seq, ack uint32
	flags    uint8
	payload  []byte
}

// parse reads an IPv4 or IPv6 packet that carries a whole TCP segment: no
// fragment, no IPv6 extension header (conntrack reassembles fragments
// before the queue), lengths within the packet.
func parse(p []byte) (segment, bool) {
	var s segment
	var src, dst netip.Addr
	var tcp []byte
	switch {
	case len(p) >= 20 && p[0]>>4 == 4:
		ihl := int(p[0]&0x0f) * 4
		total := int(binary.BigEndian.Uint16(p[2:]))
		frag := binary.BigEndian.Uint16(p[6:])
		if ihl < 20 || total < ihl || total > len(p) || p[9] != 6 || frag&0x3fff != 0 {
			return s, false
		}
		src, dst = netip.AddrFrom4([4]byte(p[12:16])), netip.AddrFrom4([4]byte(p[16:20]))
		tcp = p[ihl:total]
	case len(p) >= 40 && p[0]>>4 == 6:
		plen := int(binary.BigEndian.Uint16(p[4:]))
		if p[6] != 6 || 40+plen > len(p) {
			return s, false
		}
		src, dst = netip.AddrFrom16([16]byte(p[8:24])), netip.AddrFrom16([16]byte(p[24:40]))
		tcp = p[40 : 40+plen]
	default:
		return s, false
	}
	if len(tcp) < 20 {
		return s, false
	}
	doff := int(tcp[12]>>4) * 4
	if doff < 20 || doff > len(tcp) {
		return s, false
	}
	s.src = netip.AddrPortFrom(src, binary.BigEndian.Uint16(tcp[0:]))
	s.dst = netip.AddrPortFrom(dst, binary.BigEndian.Uint16(tcp[2:]))
	s.seq, s.ack = binary.BigEndian.Uint32(tcp[4:]), binary.BigEndian.Uint32(tcp[8:])
	s.flags = tcp[13]
	s.payload = tcp[doff:]
	return s, true
}

// Queued is a packet a queue gave the gate: its id for the verdict, the
// packet from its network header on, and whether it comes from the VM's
// side (the interface it came in on says: a source address can lie).
type Queued struct {
	ID     uint32
	Packet []byte
	FromVM bool
}

// Queue is where a gate's packets come from and its verdicts go (a
// netfilter queue, package nfqueue, with the caller's marks for Allow
// and Refuse).
type Queue interface {
	// Receive waits for the next packets; an error ends Serve.
	Receive() ([]Queued, error)
	// Verdict gives packet id action a (not Hold).
	Verdict(id uint32, a Action) error
}

// Serve runs g over q until q's Receive fails (the queue closed): each
// packet judged, each verdict given, each refusal told to refused, and
// the connections past Wait expired every second. It returns the error
// that ended it, and the first a verdict met, joined; a panic in the gate
// ends it too, as an error (its state is then not to be trusted: the
// caller starts again).
func Serve(g *Gate, q Queue, refused func(Refusal)) error {
	var mu sync.Mutex
	var verdictErr, panicked error
	give := func(vs []Verdict) {
		for _, v := range vs {
			if v.Action == Hold {
				continue
			}
			if err := q.Verdict(v.ID, v.Action); err != nil && verdictErr == nil {
				verdictErr = err
			}
		}
	}
	safely := func(f func()) (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("flowgate: %v", r)
			}
		}()
		f()
		return nil
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				var rs []Refusal
				mu.Lock()
				if err := safely(func() {
					var vs []Verdict
					vs, rs = g.Expire(now)
					give(vs)
				}); err != nil {
					panicked = err
					mu.Unlock()
					return
				}
				mu.Unlock()
				for _, r := range rs {
					refused(r)
				}
			}
		}
	}()
	for {
		ps, err := q.Receive()
		mu.Lock()
		if err == nil {
			err = panicked
		}
		mu.Unlock()
		if err != nil {
			mu.Lock()
			defer mu.Unlock()
			return errors.Join(err, verdictErr)
		}
		for _, p := range ps {
			var r *Refusal
			mu.Lock()
			err := safely(func() {
				var vs []Verdict
				vs, r = g.Packet(p.ID, p.Packet, p.FromVM, time.Now())
				give(vs)
			})
			mu.Unlock()
			if err != nil {
				return err
			}
			if r != nil {
				refused(*r)
			}
		}
	}
}
