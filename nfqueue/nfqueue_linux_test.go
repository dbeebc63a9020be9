package nfqueue

import (
	"encoding/binary"
	"net"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/test/testutil"
)

const (
	testQueue = 7
	testPort  = 9999
	passMark  = 0x1
)

// queueRules makes, in the current namespace, table ip nfqueue-test with
// an output chain: a packet marked passMark is accepted, and a UDP one to
// testPort goes to queue testQueue (xtables' NFQUEUE target, through
// nft_compat, as this kernel has no nftables queue statement).
func queueRules(t *testing.T) {
	t.Helper()
	c := &nftables.Conn{}
	tbl := c.AddTable(&nftables.Table{Name: "nfqueue-test", Family: nftables.TableFamilyIPv4})
	ch := c.AddChain(&nftables.Chain{Name: "out", Table: tbl, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter})
	c.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.NativeEndian.AppendUint32(nil, passMark)},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}})
	info := xt.Unknown(binary.NativeEndian.AppendUint16(binary.NativeEndian.AppendUint16(nil, testQueue), 1)) // struct xt_NFQ_info_v1
	c.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_UDP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, testPort)},
		&expr.Target{Name: "NFQUEUE", Rev: 1, Info: &info},
	}})
	if err := c.Flush(); err != nil {
		t.Fatalf("the queue's rules: %v", err)
	}
}

// TestVerdicts: datagrams queued by the kernel reach the queue whole; an
// accepted one arrives, a dropped one does not, and one repeated with a
// mark is accepted by the rule before the queue's.
func TestVerdicts(t *testing.T) {
	testutil.RequireRoot(t, "queues packets in a network namespace")
	ns := testutil.NewNS(t, "nfqueue")
	var q *Queue
	var srv, cli *net.UDPConn
	ns.MustDo(t, func() error {
		queueRules(t)
		var err error
		if q, err = Open(testQueue, 0xffff, 64); err != nil {
			return err
		}
		if srv, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: testPort}); err != nil {
			return err
		}
		cli, err = net.DialUDP("udp4", nil, srv.LocalAddr().(*net.UDPAddr))
		return err
	})
	t.Cleanup(func() { q.Close(); srv.Close(); cli.Close() })

	verdicts := map[string]Verdict{"accept": Accept, "drop": Drop, "repeat": Repeat}
	seen := make(chan string, 3)
	go func() {
		for {
			ps, err := q.Receive()
			if err != nil {
				return
			}
			for _, p := range ps {
				// An IPv4 header of 20 bytes, a UDP header of 8, then the
				// datagram: the queue gave the packet whole.
				if len(p.Payload) < 28 || p.Payload[0]>>4 != 4 {
					t.Errorf("queued packet %d: % x", p.ID, p.Payload)
					continue
				}
				if p.InDev != 0 || p.OutDev != 1 {
					t.Errorf("queued packet %d: in on %d, out on %d; want none and lo (1), as the output hook sees it", p.ID, p.InDev, p.OutDev)
				}
				word := string(p.Payload[28:])
				seen <- word
				var mark *uint32
				if verdicts[word] == Repeat {
					m := uint32(passMark)
					mark = &m
				}
				if err := q.SetVerdict(p.ID, verdicts[word], mark); err != nil {
					t.Errorf("verdict on %q: %v", word, err)
				}
			}
		}
	}()
	for _, w := range []string{"drop", "accept", "repeat"} {
		if _, err := cli.Write([]byte(w)); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	buf := make([]byte, 64)
	for len(got) < 2 {
		// No deadline of ours decides: the two datagrams come, or the
		// test's own timeout says they did not.
		n, err := srv.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, string(buf[:n]))
	}
	// "drop", written first, would have arrived first.
	if got[0] != "accept" || got[1] != "repeat" {
		t.Errorf("arrived %q, want accept then repeat (drop dropped)", got)
	}
	// The dropped one was queued (and so judged), not lost on the way.
	queued := map[string]bool{}
	for range 3 {
		queued[<-seen] = true
	}
	if !queued["drop"] {
		t.Errorf("queued %v: the dropped datagram never reached the queue", queued)
	}
}
