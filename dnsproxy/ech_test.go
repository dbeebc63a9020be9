package dnsproxy

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"

	"github.com/miekg/dns"
)

// TestNoECH: a client NoECH names gets the upstream's HTTPS records
// without their ECH configuration (the rest of each record kept); another
// client gets them whole.
func TestNoECH(t *testing.T) {
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		hdr := dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeHTTPS, Class: dns.ClassINET, Ttl: 300}
		m.Answer = append(m.Answer, &dns.HTTPS{SVCB: dns.SVCB{Hdr: hdr, Priority: 1, Target: ".", Value: []dns.SVCBKeyValue{
			&dns.SVCBAlpn{Alpn: []string{"h2"}}, &dns.SVCBECHConfig{ECH: []byte{0, 4, 0xfe, 0x0d, 0, 0}},
		}}})
		w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	sandboxed := netip.MustParseAddr("10.9.0.100") // dnsRecorder's client
	for _, noECH := range []bool{true, false} {
		h := &Proxy{
			Upstreams: []string{pc.LocalAddr().String()},
			NoECH:     func(client netip.Addr) bool { return noECH && client == sandboxed },
			Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, network, addr)
			},
			Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		}
		req := new(dns.Msg)
		req.SetQuestion("api.test.", dns.TypeHTTPS)
		w := &dnsRecorder{}
		h.ServeDNS(w, req)
		if len(w.msgs) != 1 || len(w.msgs[0].Answer) != 1 {
			t.Fatalf("noECH %v: replies %v", noECH, w.msgs)
		}
		https, ok := w.msgs[0].Answer[0].(*dns.HTTPS)
		if !ok {
			t.Fatalf("noECH %v: answer %v", noECH, w.msgs[0].Answer[0])
		}
		var keys []dns.SVCBKey
		for _, kv := range https.Value {
			keys = append(keys, kv.Key())
		}
		want := []dns.SVCBKey{dns.SVCB_ALPN, dns.SVCB_ECHCONFIG}
		if noECH {
			want = want[:1]
		}
		if len(keys) != len(want) || keys[0] != want[0] || (len(want) == 2 && keys[1] != want[1]) {
			t.Errorf("noECH %v: the answer's keys %v, want %v (%v)", noECH, keys, want, https)
		}
	}
}
