package netplane

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/hostnet"

	"github.com/miekg/dns"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/nettypes"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestVMEgressKeptAcrossRebuild: the network's table is built again (a
// Start after a controller restart, a repair) with the VMs' own policies
// as they were, in the same transaction: a VM is never, for a moment,
// under its network's policy instead of its own.
func TestVMEgressKeptAcrossRebuild(t *testing.T) {
	needRoot(t)
	host := testutil.NewNS(t, "ek-host")
	n := testNet("ek", api.ModeShared, "10.9.10.0/24")
	nw := start(t, host, n, Options{StateDir: t.TempDir(), Upstreams: []string{"127.0.0.1:53"}})
	mac := mustMAC("52:55:55:00:0a:01")
	ip := netip.MustParseAddr("10.9.10.50")
	if err := nw.SetHost(mac, "p", ip); err != nil {
		t.Fatal(err)
	}
	if err := nw.SetVMEgress(context.Background(), []nettypes.VMEgress{{MAC: mac.String(), Egress: &api.Egress{DefaultAllow: false}}}); err != nil {
		t.Fatal(err)
	}
	own := func() string {
		return host.MustRun(t, "nft", "list", "set", "inet", hostnet.TableName(n.ID), egressOwn4)
	}
	if out := own(); !strings.Contains(out, ip.String()) {
		t.Fatalf("the VM's own policy is not in force:\n%s", out) // the control
	}
	host.MustDo(t, func() error { return ensureTable(context.Background(), n) })
	if out := own(); !strings.Contains(out, ip.String()) {
		t.Errorf("the table was built again without the VM's own policy:\n%s", out)
	}
	if out := host.MustRun(t, "nft", "list", "map", "inet", hostnet.TableName(n.ID), egressVM4); !strings.Contains(out, ip.String()) {
		t.Errorf("the VM's map was not kept:\n%s", out)
	}
	nw.Close()
}

// TestLearnedNamesPerClient: one client's answers for a listed wildcard
// may put at most maxLearnedPerClient addresses in the network's name
// sets; another client still gets the addresses of its answers in.
func TestLearnedNamesPerClient(t *testing.T) {
	needRoot(t)
	host := testutil.NewNS(t, "ln-host")
	n := testNet("ln", api.ModeShared, "10.9.11.0/24")
	n.Egress = &api.Egress{Rules: []api.EgressRule{{Allow: true, Name: "*.cloud.test"}}}
	nw := start(t, host, n, Options{StateDir: t.TempDir(), Upstreams: []string{"127.0.0.1:53"}})
	defer nw.Close()
	answer := func(name string, first netip.Addr, count int) []dns.RR {
		var rrs []dns.RR
		for ip := first; count > 0; ip, count = ip.Next(), count-1 {
			rrs = append(rrs, &dns.A{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300}, A: ip.AsSlice()})
		}
		return rrs
	}
	greedy, other := netip.MustParseAddr("10.9.11.50"), netip.MustParseAddr("10.9.11.51")
	// Answers of 1024 addresses each, as many as the sets hold in all.
	first := netip.MustParseAddr("198.18.0.1")
	for range maxLearned / 1024 {
		nw.learnNames(greedy, "a.cloud.test.", answer("a.cloud.test.", first, 1024))
		for range 1024 {
			first = first.Next()
		}
	}
	nw.names.mu.Lock()
	held := nw.names.per[greedy]
	nw.names.mu.Unlock()
	if held != maxLearnedPerClient {
		t.Errorf("one client's answer put %d addresses in, want %d at most", held, maxLearnedPerClient)
	}
	mine := netip.MustParseAddr("198.19.0.1")
	nw.learnNames(other, "b.cloud.test.", answer("b.cloud.test.", mine, 1))
	if out := host.MustRun(t, "nft", "list", "set", "inet", hostnet.TableName(n.ID), EgressNames4); !strings.Contains(out, mine.String()) {
		t.Errorf("another client's allowed address is not in force")
	}
}

// TestLearnedNamesByLabel: a policy that allows "*.wild.test" learns the
// answer for a name under wild.test, not the answer for the query whose
// first label holds a dot (evil\.wild, then test: a name under test
// alone), which as text ends in ".wild.test" too.
func TestLearnedNamesByLabel(t *testing.T) {
	needRoot(t)
	host := testutil.NewNS(t, "lb-host")
	n := testNet("lb", api.ModeShared, "10.9.12.0/24")
	n.Egress = &api.Egress{Rules: []api.EgressRule{{Allow: true, Name: "*.wild.test"}}}
	nw := start(t, host, n, Options{StateDir: t.TempDir(), Upstreams: []string{"127.0.0.1:53"}})
	defer nw.Close()
	client := netip.MustParseAddr("10.9.12.50")
	for _, c := range []struct {
		labels []string // as their bytes on the wire
		ip     string
		want   bool
	}{
		{[]string{"evil.wild", "test"}, "198.18.1.1", false},
		{[]string{"good", "wild", "test"}, "198.18.1.2", true}, // the control
	} {
		// The query as a guest sends it, parsed as the proxy parses it.
		wire := []byte{0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0}
		for _, l := range c.labels {
			wire = append(append(wire, byte(len(l))), l...)
		}
		wire = append(wire, 0, 0, 1, 0, 1)
		q := new(dns.Msg)
		if err := q.Unpack(wire); err != nil {
			t.Fatal(err)
		}
		name := q.Question[0].Name
		nw.learnNames(client, name, []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300}, A: netip.MustParseAddr(c.ip).AsSlice()}})
		out := host.MustRun(t, "nft", "list", "set", "inet", hostnet.TableName(n.ID), EgressNames4)
		if got := strings.Contains(out, c.ip); got != c.want {
			t.Errorf("the answer for %q (%s) allowed by *.wild.test: %v, want %v", name, c.ip, got, c.want)
		}
	}
}
