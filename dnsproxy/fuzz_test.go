package dnsproxy

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

// FuzzLocalName checks the DNS proxy's name parsing: a local name is one
// lower-case label, the query is that label (under vmnet.internal when in
// the zone) in any case, and parsing the name again gives it back.
func FuzzLocalName(f *testing.F) {
	for _, s := range []string{"vm1.vmnet.internal.", "vm1.", ".", "", "a..vmnet.internal", "VMNET.INTERNAL.",
		"Vm1.VmNet.Internal", "a.b.vmnet.internal.", "vmnet.internal..", "\xc3\x89.", "x.vmnet.internal.extra."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, q string) {
		name, inZone, ok := LocalName(q)
		lq := strings.TrimSuffix(LowerASCII(q), ".")
		if want := lq == Domain || strings.HasSuffix(lq, "."+Domain); inZone != want {
			t.Fatalf("LocalName(%q): inZone %v, want %v", q, inZone, want)
		}
		if !ok {
			if name != "" {
				t.Fatalf("LocalName(%q) = %q but not ok", q, name)
			}
			return
		}
		if name == "" || strings.Contains(name, ".") || LowerASCII(name) != name {
			t.Fatalf("LocalName(%q) = %q: not one lower-case label", q, name)
		}
		want := name
		if inZone {
			want += "." + Domain
		}
		if lq != want {
			t.Fatalf("LocalName(%q) = %q, %v: the query is not that name", q, name, inZone)
		}
		if n2, z2, ok2 := LocalName(name + "." + Domain + "."); n2 != name || !z2 || !ok2 {
			t.Fatalf("LocalName(%q) = %q, %v, %v; want %q in the zone", name+"."+Domain+".", n2, z2, ok2, name)
		}
	})
}

// dnsRecorder is a dns.ResponseWriter that keeps what is written.
type dnsRecorder struct {
	msgs []*dns.Msg
}

func (w *dnsRecorder) LocalAddr() net.Addr { return &net.UDPAddr{IP: net.IPv4(10, 9, 0, 1), Port: 53} }
func (w *dnsRecorder) RemoteAddr() net.Addr {
	return &net.UDPAddr{IP: net.IPv4(10, 9, 0, 100), Port: 5353}
}
func (w *dnsRecorder) WriteMsg(m *dns.Msg) error {
	w.msgs = append(w.msgs, m)
	return nil
}
func (w *dnsRecorder) Write([]byte) (int, error) { return 0, errors.New("not expected") }
func (w *dnsRecorder) Close() error              { return nil }
func (w *dnsRecorder) TsigStatus() error         { return nil }
func (w *dnsRecorder) TsigTimersOnly(bool)       {}
func (w *dnsRecorder) Hijack()                   {}

// FuzzDNSServe feeds the DNS proxy raw queries, with one VM (vm1 at
// 10.9.0.100) and an upstream that cannot be reached. Exactly one reply
// goes out, with the query's id, and it packs; a question about vm1 is
// answered authoritatively with vm1's address and nothing else; another
// name under vmnet.internal gets NXDOMAIN; the rest SERVFAIL (no upstream).
func FuzzDNSServe(f *testing.F) {
	for _, q := range []struct {
		name  string
		qtype uint16
	}{{"vm1.vmnet.internal.", dns.TypeA}, {"VM1.", dns.TypeANY}, {"vm1.vmnet.internal.", dns.TypeAAAA},
		{"nosuch.vmnet.internal.", dns.TypeA}, {"example.test.", dns.TypeA}, {"vmnet.internal.", dns.TypeSOA}} {
		m := new(dns.Msg)
		m.SetQuestion(q.name, q.qtype)
		b, err := m.Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	vm1 := netip.MustParseAddr("10.9.0.100")
	h := &Proxy{
		Resolve: func(name string) (netip.Addr, bool) {
			if name == "vm1" {
				return vm1, true
			}
			return netip.Addr{}, false
		},
		Upstreams: []string{"192.0.2.53:53"},
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return nil, errors.New("no upstream in a fuzzer")
		},
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		req := new(dns.Msg)
		if err := req.Unpack(b); err != nil {
			return
		}
		w := &dnsRecorder{}
		h.ServeDNS(w, req)
		if len(w.msgs) != 1 {
			t.Fatalf("%d replies to %v", len(w.msgs), req)
		}
		resp := w.msgs[0]
		if resp.Id != req.Id || !resp.Response {
			t.Fatalf("reply %v does not answer %v", resp, req)
		}
		if _, err := resp.Pack(); err != nil {
			t.Fatalf("reply %v does not pack: %v", resp, err)
		}
		local, inZone := false, false
		if len(req.Question) == 1 && req.Question[0].Qclass == dns.ClassINET {
			var name string
			var ok bool
			name, inZone, ok = LocalName(req.Question[0].Name)
			local = ok && name == "vm1"
		}
		switch {
		case local:
			if resp.Rcode != dns.RcodeSuccess || !resp.Authoritative {
				t.Fatalf("vm1: reply %v", resp)
			}
			q := req.Question[0]
			for _, rr := range resp.Answer {
				a, isA := rr.(*dns.A)
				if !isA || a.Hdr.Name != q.Name || a.A.String() != vm1.String() {
					t.Fatalf("vm1: answer %v", rr)
				}
			}
			if wantA := q.Qtype == dns.TypeA || q.Qtype == dns.TypeANY; (len(resp.Answer) == 1) != wantA {
				t.Fatalf("vm1 %s: answer %v", dns.TypeToString[q.Qtype], resp.Answer)
			}
		case inZone:
			if resp.Rcode != dns.RcodeNameError || len(resp.Answer) != 0 {
				t.Fatalf("unknown local name: reply %v", resp)
			}
		default:
			if resp.Rcode != dns.RcodeServerFailure || len(resp.Answer) != 0 {
				t.Fatalf("no upstream: reply %v", resp)
			}
		}
	})
}
