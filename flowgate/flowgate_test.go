package flowgate

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

var (
	vm     = netip.MustParseAddrPort("10.0.0.2:40000")
	server = netip.MustParseAddrPort("192.0.2.1:443")
	vm6    = netip.MustParseAddrPort("[fd00::2]:40000")
	srv6   = netip.MustParseAddrPort("[2001:db8::1]:443")
	t0     = time.Unix(1_000_000, 0)
)

// judgeLine judges a connection on its first line: more until a newline,
// then allowed if the line names "ok".
func judgeLine(first []byte, _, _ netip.AddrPort) (bool, string, string) {
	line, _, found := strings.Cut(string(first), "\n")
	switch {
	case !found:
		return true, "", ""
	case line == "ok":
		return false, line, ""
	}
	return false, line, "not allowed"
}

func newGate() *Gate {
	return New(Config{Judge: judgeLine, MaxConns: 8, MaxPerClient: 4, MaxHeld: 64, Wait: 30 * time.Second})
}

// tcpPacket is an IP packet (v4 or v6 by the addresses) carrying a TCP
// segment from src to dst.
func tcpPacket(src, dst netip.AddrPort, seq, ack uint32, flags uint8, payload string) []byte {
	tcp := make([]byte, 20, 20+len(payload))
	binary.BigEndian.PutUint16(tcp[0:], src.Port())
	binary.BigEndian.PutUint16(tcp[2:], dst.Port())
	binary.BigEndian.PutUint32(tcp[4:], seq)
	binary.BigEndian.PutUint32(tcp[8:], ack)
	tcp[12], tcp[13] = 5<<4, flags
	tcp = append(tcp, payload...)
	if src.Addr().Is4() {
		ip := make([]byte, 20)
		ip[0], ip[8], ip[9] = 0x45, 64, 6
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(tcp)))
		s, d := src.Addr().As4(), dst.Addr().As4()
		copy(ip[12:], s[:])
		copy(ip[16:], d[:])
		return append(ip, tcp...)
	}
	ip := make([]byte, 40)
	ip[0], ip[6], ip[7] = 0x60, 6, 64
	binary.BigEndian.PutUint16(ip[4:], uint16(len(tcp)))
	s, d := src.Addr().As16(), dst.Addr().As16()
	copy(ip[8:], s[:])
	copy(ip[24:], d[:])
	return append(ip, tcp...)
}

// run feeds a gate packets and records what it answers.
type run struct {
	t        *testing.T
	g        *Gate
	id       uint32
	now      time.Time
	refusals []Refusal
}

func (r *run) send(fromVM bool, pkt []byte) []Verdict {
	r.t.Helper()
	r.id++
	v, ref := r.g.Packet(r.id, pkt, fromVM, r.now)
	if ref != nil {
		r.refusals = append(r.refusals, *ref)
	}
	return v
}

// want checks verdicts against "ID:action" words.
func (r *run) want(what string, got []Verdict, want ...string) {
	r.t.Helper()
	var g []string
	for _, v := range got {
		g = append(g, fmt.Sprintf("%d:%s", v.ID, v.Action))
	}
	if !slices.Equal(g, want) {
		r.t.Errorf("%s: verdicts %q, want %q", what, g, want)
	}
}

const isn = 1000

// open starts a connection from c to s: the VM's SYN and the server's
// SYN-ACK, both accepted.
// newRun is a run of a new gate (newGate) at t0.
func newRun(t *testing.T) *run { return &run{t: t, g: newGate(), now: t0} }

// opened is a new run whose connection from vm to server is open.
func opened(t *testing.T) *run {
	t.Helper()
	r := newRun(t)
	r.open(vm, server)
	return r
}

func (r *run) open(c, s netip.AddrPort) {
	r.t.Helper()
	first := r.id + 1
	r.want("SYN", r.send(true, tcpPacket(c, s, isn, 0, flagSYN, "")), fmt.Sprintf("%d:accept", first))
	r.want("SYN-ACK", r.send(false, tcpPacket(s, c, 5000, isn+1, flagSYN|flagACK, "")), fmt.Sprintf("%d:begin", first+1))
}

// TestAllowed: the bytes are held until they tell, then let go in order;
// the connection is allowed once the server acknowledges every judged
// byte, not before. IPv4 and IPv6 alike.
func TestAllowed(t *testing.T) {
	for _, ends := range [][2]netip.AddrPort{{vm, server}, {vm6, srv6}} {
		c, s := ends[0], ends[1]
		r := newRun(t)
		r.want("SYN", r.send(true, tcpPacket(c, s, isn, 0, flagSYN, "")), "1:accept")
		r.want("SYN-ACK", r.send(false, tcpPacket(s, c, 5000, isn+1, flagSYN|flagACK, "")), "2:begin")
		r.want("ACK", r.send(true, tcpPacket(c, s, isn+1, 5001, flagACK, "")), "3:accept")
		r.want("first part", r.send(true, tcpPacket(c, s, isn+1, 5001, flagACK, "o")), "4:hold")
		r.want("the rest", r.send(true, tcpPacket(c, s, isn+2, 5001, flagACK, "k\nmore")), "4:accept", "5:accept")
		r.want("a partial ACK", r.send(false, tcpPacket(s, c, 5001, isn+3, flagACK, "")), "6:accept")
		r.want("past the judged bytes", r.send(true, tcpPacket(c, s, isn+1+7, 5001, flagACK, "data")), "7:drop")
		r.want("the judged bytes again, the same", r.send(true, tcpPacket(c, s, isn+1, 5001, flagACK, "ok\nmore")), "8:accept")
		r.want("the ACK of every judged byte", r.send(false, tcpPacket(s, c, 5001, isn+1+7, flagACK, "")), "9:allow")
		// Queued before the kernel took the mark: let go.
		r.want("late", r.send(true, tcpPacket(c, s, isn+1+7, 5001, flagACK, "data")), "10:accept")
		r.g.Expire(t0.Add(allowedLinger))
		if r.g.Conns() != 0 || len(r.refusals) != 0 || r.g.heldAll != 0 {
			t.Errorf("%v: %d connections followed, %d packets held, refusals %v", c, r.g.Conns(), r.g.heldAll, r.refusals)
		}
	}
}

// TestAllowedThenReused: a SYN-ACK after Allow, with the same ISN, is
// another connection on the same ports (the VM reset the allowed one,
// unseen: its packets no longer come to the gate, and opened another):
// judged anew, not let go as the allowed one's late packets.
func TestAllowedThenReused(t *testing.T) {
	r := opened(t)
	r.want("allowed bytes", r.send(true, tcpPacket(vm, server, isn+1, 1, flagACK, "ok\n")), "3:accept")
	r.want("their ACK", r.send(false, tcpPacket(server, vm, 5001, isn+4, flagACK, "")), "4:allow")
	r.want("a SYN-ACK after Allow", r.send(false, tcpPacket(server, vm, 9000, isn+1, flagSYN|flagACK, "")), "5:begin")
	r.want("its bytes", r.send(true, tcpPacket(vm, server, isn+1, 9001, flagACK, "no\n")), "6:refuse")
}

// TestRefused: a name the judge refuses drops the held bytes and refuses
// the connection, once; what comes late is refused without another
// refusal.
func TestRefused(t *testing.T) {
	r := opened(t)
	r.want("first part", r.send(true, tcpPacket(vm, server, isn+1, 1, flagACK, "bad.")), "3:hold")
	r.want("the rest", r.send(true, tcpPacket(vm, server, isn+5, 1, flagACK, "test\n")), "3:drop", "4:refuse")
	r.want("late", r.send(true, tcpPacket(vm, server, isn+10, 1, flagACK, "x")), "5:refuse")
	r.want("the server's", r.send(false, tcpPacket(server, vm, 1, isn+10, flagACK, "")), "6:refuse")
	if len(r.refusals) != 1 || r.refusals[0].Name != "bad.test" || r.refusals[0].Why != "not allowed" || r.refusals[0].Src != vm || r.refusals[0].Dst != server {
		t.Errorf("refusals %+v", r.refusals)
	}
}

// TestEvasions: what a hostile guest sends to have bytes judged that the
// server does not take as the stream's.
func TestEvasions(t *testing.T) {
	t.Run("allowed bytes past the beginning", func(t *testing.T) {
		// "ok\n" at a later sequence number is not the stream's start:
		// dropped, and the real start is judged.
		r := opened(t)
		r.want("past a hole", r.send(true, tcpPacket(vm, server, isn+1+20, 1, flagACK, "ok\n")), "3:drop")
		r.want("the start", r.send(true, tcpPacket(vm, server, isn+1, 1, flagACK, "evil\n")), "4:refuse")
	})
	t.Run("judged bytes sent again with others", func(t *testing.T) {
		// Allowed, then the same sequence numbers with another name
		// before the server acknowledged them (the first copy made to die
		// after the host).
		r := opened(t)
		r.want("allowed", r.send(true, tcpPacket(vm, server, isn+1, 1, flagACK, "ok\n")), "3:accept")
		r.want("rewritten", r.send(true, tcpPacket(vm, server, isn+1, 1, flagACK, "no\n")), "4:refuse")
		r.want("the server's ACK after", r.send(false, tcpPacket(server, vm, 1, isn+4, flagACK, "")), "5:refuse")
		if len(r.refusals) != 1 {
			t.Errorf("refusals %+v", r.refusals)
		}
	})
	t.Run("held bytes rewritten", func(t *testing.T) {
		r := opened(t)
		r.want("held", r.send(true, tcpPacket(vm, server, isn+1, 1, flagACK, "o")), "3:hold")
		r.want("overlapping, other bytes", r.send(true, tcpPacket(vm, server, isn+1, 1, flagACK, "no\n")), "3:drop", "4:refuse")
	})
	t.Run("held bytes sent again", func(t *testing.T) {
		// A byte a segment, past the sender's window: it sends the first
		// again (no acknowledgement came), and the rest never comes.
		r := opened(t)
		r.want("held", r.send(true, tcpPacket(vm, server, isn+1, 1, flagACK, "o")), "3:hold")
		r.want("held", r.send(true, tcpPacket(vm, server, isn+2, 1, flagACK, "k")), "4:hold")
		r.want("the first again", r.send(true, tcpPacket(vm, server, isn+1, 1, flagACK, "o")), "3:drop", "4:drop", "5:refuse")
		if len(r.refusals) != 1 || !strings.Contains(r.refusals[0].Why, "again") {
			t.Errorf("refusals %+v", r.refusals)
		}
	})
	t.Run("two SYNs taken", func(t *testing.T) {
		// A server with SYN cookies answers a second SYN too: its stream
		// may be the other one.
		r := opened(t)
		r.want("another ISN's SYN-ACK", r.send(false, tcpPacket(server, vm, 7000, isn+10001, flagSYN|flagACK, "")), "3:refuse")
	})
	t.Run("an acknowledgement of another stream", func(t *testing.T) {
		// Allowed only by an acknowledgement of the judged bytes and no
		// more; bytes past them wait for it.
		r := opened(t)
		r.want("allowed bytes", r.send(true, tcpPacket(vm, server, isn+1, 1, flagACK, "ok\n")), "3:accept")
		r.want("bytes past them", r.send(true, tcpPacket(vm, server, isn+4, 1, flagACK, "more")), "4:drop")
		r.want("an ACK far past them", r.send(false, tcpPacket(server, vm, 1, isn+10001, flagACK, "")), "5:accept")
		r.want("the ACK of them and a FIN", r.send(false, tcpPacket(server, vm, 1, isn+5, flagACK, "")), "6:allow")
	})
	t.Run("the urgent pointer", func(t *testing.T) {
		// A server's stack takes the urgent byte out of what its reader
		// reads: judged bytes would not be the bytes read.
		r := opened(t)
		r.want("held", r.send(true, tcpPacket(vm, server, isn+1, 1, flagACK, "o")), "3:hold")
		r.want("an ACK with URG", r.send(true, tcpPacket(vm, server, isn+2, 1, flagACK|flagURG, "")), "3:drop", "4:refuse")
		r2 := newRun(t)
		r2.open(vm, server)
		r2.want("bytes with URG", r2.send(true, tcpPacket(vm, server, isn+1, 1, flagACK|flagURG, "ok\n")), "3:refuse")
	})
	t.Run("a RST with bytes", func(t *testing.T) {
		r := opened(t)
		r.want("RST with bytes", r.send(true, tcpPacket(vm, server, isn+1, 1, flagRST, "ok\n")), "3:drop")
		r.want("the real start", r.send(true, tcpPacket(vm, server, isn+1, 1, flagACK, "no\n")), "4:refuse")
	})
	t.Run("another SYN taken", func(t *testing.T) {
		// The server's SYN-ACK again, for the same SYN, changes nothing;
		// one for another SYN once bytes were judged refuses.
		r := opened(t)
		r.want("held", r.send(true, tcpPacket(vm, server, isn+1, 1, flagACK, "o")), "3:hold")
		r.want("the SYN-ACK again", r.send(false, tcpPacket(server, vm, 5000, isn+1, flagSYN|flagACK, "")), "4:accept")
		r.want("another SYN's", r.send(false, tcpPacket(server, vm, 5000, isn+51, flagSYN|flagACK, "")), "3:drop", "5:refuse")
	})
	t.Run("no SYN-ACK seen", func(t *testing.T) {
		r := newRun(t)
		r.want("bytes", r.send(true, tcpPacket(vm, server, isn+1, 1, flagACK, "ok\n")), "1:refuse")
		if len(r.refusals) != 1 || !strings.Contains(r.refusals[0].Why, "start was not seen") {
			t.Errorf("refusals %+v", r.refusals)
		}
	})
	t.Run("bytes in the SYN", func(t *testing.T) {
		// TCP Fast Open: refused, even with bytes that would pass.
		r := newRun(t)
		r.want("SYN with bytes", r.send(true, tcpPacket(vm, server, isn, 0, flagSYN, "ok\n")), "1:refuse")
		if len(r.refusals) != 1 || !strings.Contains(r.refusals[0].Why, "in its SYN") {
			t.Errorf("refusals %+v", r.refusals)
		}
	})
	t.Run("before the stream", func(t *testing.T) {
		r := opened(t)
		r.want("at the SYN's number", r.send(true, tcpPacket(vm, server, isn, 1, flagACK, "xok\n")), "3:drop")
	})
	t.Run("not a whole segment", func(t *testing.T) {
		r := newRun(t)
		frag := tcpPacket(vm, server, isn, 0, flagSYN, "")
		frag[6] = 0x20 // more fragments
		r.want("a fragment", r.send(true, frag), "1:drop")
		short := tcpPacket(vm, server, isn, 0, flagSYN, "")
		r.want("cut short", r.send(true, short[:30]), "2:drop")
	})
}

// TestBounds: connections per client and in all, bytes and segments held
// before a verdict, and the wait, are bounded; what is past them fails
// closed.
func TestBounds(t *testing.T) {
	r := newRun(t)
	for i := range 5 {
		c := netip.AddrPortFrom(vm.Addr(), uint16(50000+i))
		want := "begin"
		if i == 4 {
			want = "refuse" // past MaxPerClient
		}
		r.send(true, tcpPacket(c, server, isn, 0, flagSYN, ""))
		r.want("SYN-ACK", r.send(false, tcpPacket(server, c, 5000, isn+1, flagSYN|flagACK, "")), fmt.Sprintf("%d:%s", 2*i+2, want))
	}
	other := netip.MustParseAddr("10.0.0.3")
	for i := range 4 {
		r.open(netip.AddrPortFrom(other, uint16(50000+i)), server)
	}
	third := netip.MustParseAddrPort("10.0.0.4:50000")
	r.send(true, tcpPacket(third, server, isn, 0, flagSYN, ""))
	r.want("past MaxConns", r.send(false, tcpPacket(server, third, 5000, isn+1, flagSYN|flagACK, "")), "20:refuse")
	if r.g.Conns() != 8 || len(r.refusals) != 2 {
		t.Errorf("%d connections followed, want MaxConns, 8; refusals %+v", r.g.Conns(), r.refusals)
	}

	r = newRun(t)
	r.open(vm, server)
	r.want("60 bytes", r.send(true, tcpPacket(vm, server, isn+1, 1, flagACK, strings.Repeat("a", 60))), "3:hold")
	r.want("past MaxHeld", r.send(true, tcpPacket(vm, server, isn+61, 1, flagACK, strings.Repeat("a", 10))), "3:drop", "4:refuse")

	// Packets held by a client's connections: bounded, so that one
	// client cannot fill the queue for the others.
	r = &run{t: t, g: New(Config{Judge: judgeLine, MaxConns: 8, MaxPerClient: 4, MaxHeld: 64, MaxHeldPackets: 3, MaxHeldAll: 3, Wait: time.Minute}), now: t0}
	vm2 := netip.AddrPortFrom(vm.Addr(), vm.Port()+1)
	r.open(vm, server)
	r.open(vm2, server)
	r.send(true, tcpPacket(vm, server, isn+1, 1, flagACK, "a"))
	r.send(true, tcpPacket(vm, server, isn+2, 1, flagACK, "a"))
	r.want("the client's third", r.send(true, tcpPacket(vm2, server, isn+1, 1, flagACK, "a")), "7:hold")
	r.want("its fourth", r.send(true, tcpPacket(vm2, server, isn+2, 1, flagACK, "a")), "7:drop", "8:refuse")
	other3 := netip.MustParseAddrPort("10.0.0.3:40000")
	r.open(other3, server)
	r.want("another client's, the third in all", r.send(true, tcpPacket(other3, server, isn+1, 1, flagACK, "a")), "11:hold")
	other4 := netip.MustParseAddrPort("10.0.0.4:40000")
	r.open(other4, server)
	r.want("past MaxHeldAll", r.send(true, tcpPacket(other4, server, isn+1, 1, flagACK, "a")), "14:refuse")

	r = &run{t: t, g: New(Config{Judge: judgeLine, MaxConns: 8, MaxPerClient: 4, MaxHeld: 1 << 20, Wait: time.Minute}), now: t0}
	r.open(vm, server)
	var last []Verdict
	for i := range maxSegments + 1 {
		last = r.send(true, tcpPacket(vm, server, uint32(isn+1+i), 1, flagACK, "a"))
	}
	if a := last[len(last)-1].Action; a != Refuse || len(r.refusals) != 1 {
		t.Errorf("a byte a segment, %d segments: last action %v, refusals %v", maxSegments+1, a, r.refusals)
	}

	r = newRun(t)
	r.open(vm, server)
	r.send(true, tcpPacket(vm, server, isn+1, 1, flagACK, "o"))
	if v, refs := r.g.Expire(t0.Add(29 * time.Second)); len(v) != 0 || len(refs) != 0 {
		t.Errorf("expired early: %v %v", v, refs)
	}
	v, refs := r.g.Expire(t0.Add(30 * time.Second))
	r.want("expired", v, "3:refuse")
	if len(refs) != 1 || !strings.Contains(refs[0].Why, "within 30s") {
		t.Errorf("refusals %+v", refs)
	}
	r.g.Expire(t0.Add(61 * time.Second))
	if r.g.Conns() != 0 || len(r.g.perClient) != 0 {
		t.Errorf("after the refused one's wait: %d connections, per client %v", r.g.Conns(), r.g.perClient)
	}
}

// TestEnds: a reset from either side forgets the connection, its held
// bytes dropped; a new SYN on the same ports starts another.
func TestEnds(t *testing.T) {
	r := opened(t)
	r.send(true, tcpPacket(vm, server, isn+1, 1, flagACK, "o"))
	r.want("the server's RST", r.send(false, tcpPacket(server, vm, 1, isn+1, flagRST|flagACK, "")), "3:drop", "4:accept")
	r.want("a new SYN", r.send(true, tcpPacket(vm, server, 7000, 0, flagSYN, "")), "5:accept")
	r.want("its SYN-ACK", r.send(false, tcpPacket(server, vm, 1, 7001, flagSYN|flagACK, "")), "6:begin")
	r.want("its bytes", r.send(true, tcpPacket(vm, server, 7001, 1, flagACK, "ok\n")), "7:accept")
	r.want("another SYN, another ISN", r.send(true, tcpPacket(vm, server, 9000, 0, flagSYN, "")), "8:accept")
	r.want("the VM's RST", r.send(true, tcpPacket(vm, server, 9001, 0, flagRST, "")), "9:accept")
	if r.g.Conns() != 0 {
		t.Errorf("%d connections followed", r.g.Conns())
	}
	// Refused, then another connection on the same ports (another ISN,
	// as the kernel's new entry): judged anew, not refused for the old.
	r.send(false, tcpPacket(server, vm, 1, isn+1, flagSYN|flagACK, ""))
	r.want("refused", r.send(true, tcpPacket(vm, server, isn+1, 1, flagACK, "no\n")), "11:refuse")
	r.want("the refused one's SYN-ACK again", r.send(false, tcpPacket(server, vm, 1, isn+1, flagSYN|flagACK, "")), "12:refuse")
	r.want("another's SYN-ACK", r.send(false, tcpPacket(server, vm, 1, 3001, flagSYN|flagACK, "")), "13:begin")
	r.want("its bytes", r.send(true, tcpPacket(vm, server, 3001, 1, flagACK, "ok\n")), "14:accept")
	r.send(false, tcpPacket(server, vm, 1, 3004, flagACK, ""))
	r.g.Expire(t0.Add(allowedLinger))
	if r.g.Conns() != 0 {
		t.Errorf("%d connections followed", r.g.Conns())
	}
}

// TestPacketIDZero: the kernel's packet ids wrap through 0, which is a
// packet like any other.
func TestPacketIDZero(t *testing.T) {
	r := &run{t: t, g: newGate(), now: t0, id: ^uint32(0) - 2}
	r.send(true, tcpPacket(vm, server, isn, 0, flagSYN, ""))
	r.send(false, tcpPacket(server, vm, 5000, isn+1, flagSYN|flagACK, ""))
	r.want("held", r.send(true, tcpPacket(vm, server, isn+1, 1, flagACK, "o")), "0:hold")
	v, _ := r.g.Expire(t0.Add(time.Minute))
	r.want("expired", v, "0:refuse")
}

// FuzzGate: any packets, either way, get a verdict each, never a panic,
// and the gate follows no more connections than its bound.
func FuzzGate(f *testing.F) {
	f.Add(tcpPacket(server, vm, 1, isn+1, flagSYN|flagACK, ""), tcpPacket(vm, server, isn+1, 1, flagACK, "ok\n"), true)
	f.Add(tcpPacket(srv6, vm6, 1, isn+1, flagSYN|flagACK, ""), tcpPacket(srv6, vm6, 1, isn+2, flagACK, ""), false)
	f.Fuzz(func(t *testing.T, a, b []byte, bFromVM bool) {
		g := newGate()
		for i, p := range [][]byte{a, b, a, b} {
			id := uint32(i + 1)
			v, _ := g.Packet(id, p, i%2 == 0 || bFromVM, t0)
			for _, x := range v {
				if x.ID == 0 || x.ID > id {
					t.Fatalf("verdict on packet %d, given %d", x.ID, id)
				}
			}
		}
		g.Expire(t0.Add(time.Hour))
		if g.Conns() > 8 {
			t.Fatalf("%d connections", g.Conns())
		}
	})
}

// memQueue is a queue of packets given in advance; Receive fails once
// they are all read.
type memQueue struct {
	batches  [][]Queued
	verdicts []string
}

func (q *memQueue) Receive() ([]Queued, error) {
	if len(q.batches) == 0 {
		return nil, io.EOF
	}
	b := q.batches[0]
	q.batches = q.batches[1:]
	return b, nil
}

func (q *memQueue) Verdict(id uint32, a Action) error {
	q.verdicts = append(q.verdicts, fmt.Sprintf("%d:%s", id, a))
	return nil
}

// TestServe: Serve gives every verdict but Hold, tells each refusal, and
// ends with the queue's error. (bench's TestNameGatePath runs it over a
// real netfilter queue.)
func TestServe(t *testing.T) {
	q := &memQueue{batches: [][]Queued{
		{{1, tcpPacket(vm, server, isn, 0, flagSYN, ""), true}, {2, tcpPacket(server, vm, 1, isn+1, flagSYN|flagACK, ""), false}},
		{{3, tcpPacket(vm, server, isn+1, 1, flagACK, "o"), true}},
		{{4, tcpPacket(vm, server, isn+2, 1, flagACK, "k\n"), true}},
		{{5, tcpPacket(srv6, vm6, 1, isn+1, flagSYN|flagACK, ""), false}, {6, tcpPacket(vm6, srv6, isn+1, 1, flagACK, "no\n"), true}},
		{{7, tcpPacket(server, vm, 1, isn+4, flagACK, ""), false}},
	}}
	var refused []string
	err := Serve(newGate(), q, func(r Refusal) { refused = append(refused, r.Name) })
	if !errors.Is(err, io.EOF) {
		t.Errorf("Serve ended with %v, want the queue's io.EOF", err)
	}
	if want := []string{"1:accept", "2:begin", "3:accept", "4:accept", "5:begin", "6:refuse", "7:allow"}; !slices.Equal(q.verdicts, want) {
		t.Errorf("verdicts %q, want %q", q.verdicts, want)
	}
	if !slices.Equal(refused, []string{"no"}) {
		t.Errorf("refused %q", refused)
	}
}

// TestServePanic: a panic in the gate (here its judge's) ends Serve with
// an error, not the process.
func TestServePanic(t *testing.T) {
	q := &memQueue{batches: [][]Queued{
		{{1, tcpPacket(server, vm, 1, isn+1, flagSYN|flagACK, ""), false}},
		{{2, tcpPacket(vm, server, isn+1, 1, flagACK, "ok\n"), true}},
	}}
	g := New(Config{Judge: func([]byte, netip.AddrPort, netip.AddrPort) (bool, string, string) { panic("the judge") },
		MaxConns: 8, MaxPerClient: 4, MaxHeld: 64, Wait: time.Minute})
	if err := Serve(g, q, func(Refusal) {}); err == nil || !strings.Contains(err.Error(), "the judge") {
		t.Errorf("Serve ended with %v", err)
	}
}
