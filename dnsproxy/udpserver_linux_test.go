package dnsproxy

import (
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// blockingHandler never answers: it holds its handler slot until release
// is closed, and counts the questions it got by their source.
type blockingHandler struct {
	release chan struct{}
	fromOK  atomic.Int64
}

func (h *blockingHandler) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	if w.RemoteAddr().(*net.UDPAddr).IP.Equal(net.IPv4(127, 0, 0, 2)) {
		h.fromOK.Add(1)
	}
	<-h.release
}

// TestUDPServerAllow: with allow set, strangers' datagrams take no handler,
// so however many they send, those allowed are still heard. Without it,
// one stranger holding the only handler would crowd them out.
func TestUDPServerAllow(t *testing.T) {
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	h := &blockingHandler{release: make(chan struct{})}
	s := NewUDPServer(conn, h, 1, nil, func(a netip.Addr) bool { return a == netip.MustParseAddr("127.0.0.2") })
	done := make(chan struct{})
	go func() { s.Serve(); close(done) }()
	t.Cleanup(func() { close(h.release); s.Close(); <-done })
	query := new(dns.Msg).SetQuestion("web1.210.peers.vmnet.internal.", dns.TypeA)
	b, _ := query.Pack()
	send := func(from string) {
		c, err := net.DialUDP("udp4", &net.UDPAddr{IP: net.ParseIP(from)}, conn.LocalAddr().(*net.UDPAddr))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write(b)
	}
	for range 50 {
		send("127.0.0.3") // a stranger on the underlay
	}
	testutil.Eventually(t, 5*time.Second, func() bool {
		send("127.0.0.2") // a host of the segment (again, if one was lost)
		return h.fromOK.Load() > 0
	}, "the allowed host's question to take the handler the strangers did not")
}
