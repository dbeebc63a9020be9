package dnsproxy

import (
	"testing"

	"github.com/miekg/dns"
)

// TestAcceptQuery: the proxy takes plain queries only: not a NOTIFY (which
// would reach the host's resolver as the host's own), a response, a query
// that carries answer or authority records, or one without a question.
func TestAcceptQuery(t *testing.T) {
	pack := func(f func(m *dns.Msg)) []byte {
		m := new(dns.Msg)
		m.SetQuestion("a.vmnet.internal.", dns.TypeA)
		f(m)
		b, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	rr, _ := dns.NewRR("a.vmnet.internal. 60 IN A 10.0.0.1")
	for _, c := range []struct {
		what string
		f    func(m *dns.Msg)
		want bool
	}{
		{"a query", func(*dns.Msg) {}, true},
		{"a query with EDNS", func(m *dns.Msg) { m.SetEdns0(1232, false) }, true},
		{"a NOTIFY", func(m *dns.Msg) { m.Opcode = dns.OpcodeNotify }, false},
		{"an UPDATE", func(m *dns.Msg) { m.Opcode = dns.OpcodeUpdate }, false},
		{"a response", func(m *dns.Msg) { m.Response = true }, false},
		{"with an answer", func(m *dns.Msg) { m.Answer = []dns.RR{rr} }, false},
		{"with authority", func(m *dns.Msg) { m.Ns = []dns.RR{rr} }, false},
		{"no question", func(m *dns.Msg) { m.Question = nil }, false},
	} {
		if got := acceptQuery(pack(c.f)); got != c.want {
			t.Errorf("%s: accepted %v, want %v", c.what, got, c.want)
		}
	}
}
