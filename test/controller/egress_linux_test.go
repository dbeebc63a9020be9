package controller_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/hostnet"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/miekg/dns"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/test/simvm"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

const egressNetworks = `
vmnet:
  sandbox:
    subnet: 10.88.0.0/24
    egress:
      default: deny
      allow: [198.51.100.0/24, allowed.test]
      deny: [198.51.100.3, host, nope.test]
  open:
    subnet: 10.89.0.0/24
`

// TestEgress: a network's egress policy decides what its VMs connect to,
// the longest prefix first: an allowed /24 is reached, a denied address in
// it is not, nor what the default denies, nor the host's own services
// (DNS on the gateway still answers); a network without a policy reaches
// all of them; the refusals are counted; a VM's policy changed by an
// `up` applies without restarting its helper or touching its lease.
func TestEgress(t *testing.T) {
	h := &host{Host: simvm.NewHost(t, "vmneg", egressNetworks, "pgrep"), t: t}
	lan := testutil.NewNS(t, "eglan")
	link(t, h, "lan", "198.51.100.1/24", lan, "198.51.100.2/24", "198.51.100.3/24")
	wan := testutil.NewNS(t, "egwan")
	link(t, h, "uplink", "203.0.113.1/24", wan, "203.0.113.2/24", "2001:db8:100::2/64")
	h.MustRun(t, "ip", "route", "add", "default", "via", "203.0.113.2")
	h.MustRun(t, "ip", "addr", "add", "2001:db8:100::1/64", "dev", "uplink", "nodad")
	h.MustRun(t, "ip", "-6", "route", "add", "default", "via", "2001:db8:100::2")
	serveText(t, lan.Listen(t, "tcp4", "198.51.100.2:7000"), "lan .2")
	serveText(t, lan.Listen(t, "tcp4", "198.51.100.3:7000"), "lan .3")
	serveText(t, wan.Listen(t, "tcp4", "203.0.113.2:7000"), "internet")
	serveText(t, wan.Listen(t, "tcp6", "[2001:db8:100::2]:7000"), "internet over IPv6")
	serveText(t, h.Listen(t, "tcp4", "0.0.0.0:7100"), "host service")
	// The host's resolver, for the DNS proxy to forward to: a server on
	// the WAN side (ip netns exec gives the namespace's processes
	// /etc/netns/NAME/resolv.conf as /etc/resolv.conf).
	serveDNS(t, wan, "203.0.113.2:53", map[string]string{"allowed.test.": "198.51.100.3", "nope.test.": "198.51.100.2", "unlisted.test.": "203.0.113.2"})
	etc := filepath.Join("/etc/netns", h.Name)
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(etc) })
	if err := os.WriteFile(filepath.Join(etc, "resolv.conf"), []byte("nameserver 203.0.113.2\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	vmsYAML := `vms:
  s:
    networks:
      - vmnet: sandbox
  o:
    networks:
      - vmnet: open
  p:
    networks:
      - vmnet: open
        egress: {default: deny, allow: [198.51.100.2, allowed.test]}
  q:
    networks:
      - vmnet: sandbox
        egress: {default: allow, deny: [198.51.100.2]}
  r:
    networks:
      - vmnet: open
        egress: {default: allow, deny: [198.51.100.3]}
`
	h.MustVmnetctl("up", "-f", h.WriteFile("vms.yaml", vmsYAML))
	st := h.Status()
	s, o := h.VM(h.Attachment(st, "s")), h.VM(h.Attachment(st, "o"))
	p, q := h.VM(h.Attachment(st, "p")), h.VM(h.Attachment(st, "q"))
	for _, vm := range []*simvm.VM{s, o, p, q} {
		vm.DHCP(t)
	}

	var wg sync.WaitGroup
	for _, c := range []struct {
		vm    *simvm.VM
		addr  string
		want  string // "" for no way through
		where string
	}{
		{s, "198.51.100.2:7000", "lan .2", "an allowed /24"},
		{s, "198.51.100.3:7000", "", "a denied address in the allowed /24"},
		{s, "203.0.113.2:7000", "", "what the default denies"},
		{s, "10.88.0.1:7100", "", "the host's service (host denied)"},
		{o, "198.51.100.2:7000", "lan .2", "control: an open network"},
		{o, "198.51.100.3:7000", "lan .3", "control: an open network"},
		{o, "203.0.113.2:7000", "internet", "control: an open network"},
		{o, "10.89.0.1:7100", "host service", "control: an open network"},
		// VMs with policies of their own, in place of their network's.
		{p, "198.51.100.2:7000", "lan .2", "p's own allow, on an open network"},
		{p, "198.51.100.3:7000", "", "p's own default deny"},
		{p, "203.0.113.2:7000", "", "p's own default deny"},
		{q, "203.0.113.2:7000", "internet", "q's own default allow, on the sandbox"},
		{q, "198.51.100.3:7000", "lan .3", "q's own default allow, though the sandbox denies it"},
		{q, "198.51.100.2:7000", "", "q's own deny"},
	} {
		wg.Go(func() {
			got, err := dialHello(c.vm.NS, c.addr)
			if got != c.want {
				t.Errorf("%s to %s (%s): got %q (%v), want %q", c.vm.Name, c.addr, c.where, got, err, c.want)
			}
		})
	}
	wg.Wait()
	// Not only new connections: an unsolicited ICMP echo reply (conntrack
	// calls it invalid), a way to carry data out one way, is refused too.
	icmpIn := wan.ListenPacket(t, "ip4:icmp", "203.0.113.2")
	got := make(chan string, 16)
	go func() {
		buf := make([]byte, 1500)
		for {
			n, _, err := icmpIn.ReadFrom(buf)
			if err != nil {
				return
			}
			if n > 8 && buf[0] == 0 { // an echo reply
				got <- string(buf[8:n])
			}
		}
	}()
	if err := s.Do(func() error {
		c, err := net.ListenPacket("ip4:icmp", "0.0.0.0")
		if err != nil {
			return err
		}
		defer c.Close()
		reply := (&icmp.Message{Type: ipv4.ICMPTypeEchoReply, Body: &icmp.Echo{ID: 7, Seq: 1, Data: []byte("exfil")}})
		b, err := reply.Marshal(nil)
		if err != nil {
			return err
		}
		_, err = c.WriteTo(b, &net.IPAddr{IP: net.ParseIP("203.0.113.2")})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// The control: o's reply arrives (so the one from s would have).
	if err := o.Do(func() error {
		c, err := net.ListenPacket("ip4:icmp", "0.0.0.0")
		if err != nil {
			return err
		}
		defer c.Close()
		b, _ := (&icmp.Message{Type: ipv4.ICMPTypeEchoReply, Body: &icmp.Echo{ID: 7, Seq: 2, Data: []byte("control")}}).Marshal(nil)
		_, err = c.WriteTo(b, &net.IPAddr{IP: net.ParseIP("203.0.113.2")})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	select {
	case data := <-got:
		if strings.Contains(data, "exfil") {
			t.Errorf("an unsolicited ICMP echo reply from s passed the default deny")
		} else if !strings.Contains(data, "control") {
			t.Errorf("the WAN got %q", data)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("the control echo reply from o did not arrive")
	}

	if out, err := s.Run(context.Background(), "busybox", "nslookup", "s.vmnet.internal", "10.88.0.1"); err != nil || !strings.Contains(out, "10.88.0.") {
		t.Errorf("DNS on the gateway, with the host denied: %v\n%s", err, out)
	}

	// Names: an allowed name's address is reached over HTTP (and HTTPS),
	// its name checked, once the VM resolved it through the network's DNS
	// proxy, though its prefix is denied, and nothing else there is; a
	// denied name's address is refused, though its prefix is allowed.
	serveCDN(t, lan, "198.51.100.3")
	for _, c := range []struct{ name, addr, want string }{
		{"allowed.test", "198.51.100.3:7000", ""}, // a name allows HTTP and HTTPS alone
		{"unlisted.test", "203.0.113.2:7000", ""}, // resolving a name the policy does not list opens nothing
		{"nope.test", "198.51.100.2:7000", ""},
	} {
		if out, err := s.Run(context.Background(), "busybox", "nslookup", "-type=a", c.name, "10.88.0.1"); err != nil {
			t.Fatalf("resolving %s: %v\n%s", c.name, err, out)
		}
		if got, err := dialHello(s.NS, c.addr); got != c.want {
			t.Errorf("s to %s after resolving %s: got %q (%v), want %q", c.addr, c.name, got, err, c.want)
		}
	}
	if got := httpGet(s, "198.51.100.3:80", "allowed.test"); got != "200 host allowed.test|" {
		t.Errorf("s over HTTP to allowed.test, resolved: %q", got)
	}

	// IPv6 alike: the sandbox's default deny holds for s over IPv6 (its
	// SLAAC address, through NAT66), the open network's o gets there.
	slaacAddress(t, s, api.ULAPrefix("sandbox").String())
	slaacAddress(t, o, api.ULAPrefix("open").String())
	if got, err := dialHello(o.NS, "[2001:db8:100::2]:7000"); got != "internet over IPv6" {
		t.Errorf("o to the internet over IPv6 (control): got %q (%v)", got, err)
	}
	if got, _ := dialHello(s.NS, "[2001:db8:100::2]:7000"); got != "" {
		t.Errorf("s to the internet over IPv6, default deny: got %q", got)
	}

	// A name in a VM's own policy: p reaches allowed.test's address once
	// it resolved it (learned for p alone: o, which asked nothing, and the
	// sandbox's s are unaffected).
	if out, err := p.Run(context.Background(), "busybox", "nslookup", "-type=a", "allowed.test", "10.89.0.1"); err != nil {
		t.Fatalf("p resolving allowed.test: %v\n%s", err, out)
	}
	if got := httpGet(p, "198.51.100.3:80", "allowed.test"); got != "200 host allowed.test|" {
		t.Errorf("p over HTTP to allowed.test after resolving it: %q", got)
	}
	// Another VM with a policy of its own, r, takes a lease and releases
	// it (any VM may, in a loop): what p learned stays, only r's goes.
	r := h.VM(h.Attachment(st, "r"))
	lease := r.DHCP(t)
	rmac, err := net.ParseMAC(h.Attachment(st, "r").MAC)
	if err != nil {
		t.Fatal(err)
	}
	release, err := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeRelease),
		dhcpv4.WithHwAddr(rmac), dhcpv4.WithClientIP(net.ParseIP(lease["ip"])),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.ParseIP(lease["serverid"]))))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.NS.Do(func() error {
		c, err := net.DialUDP("udp4", &net.UDPAddr{IP: net.ParseIP(lease["ip"]), Port: 68}, &net.UDPAddr{IP: net.ParseIP(lease["serverid"]), Port: 67})
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(release.ToBytes())
		return err
	}); err != nil {
		t.Fatalf("r's DHCPRELEASE: %v", err)
	}
	testutil.Eventually(t, 10*time.Second, func() error {
		if out := h.MustRun(t, "nft", "list", "set", "inet", hostnet.TableName("open"), "egress-own4"); strings.Contains(out, lease["ip"]+",") || strings.Contains(out, lease["ip"]+" ") {
			return fmt.Errorf("r's released address %s is still in its policy's sources:\n%s", lease["ip"], out)
		}
		return nil
	}, "r's release applied")
	if got := httpGet(p, "198.51.100.3:80", "allowed.test"); got != "200 host allowed.test|" {
		t.Errorf("p over HTTP to allowed.test after r released its lease: %q, want what p learned kept", got)
	}
	// p's policy no longer lists the name (its ranges are the same): what
	// it learned for it goes. The change is made in place: p's helper
	// and its lease are the same after it (issue 33: a live policy).
	pBefore := h.Attachment(h.Status(), "p")
	h.MustVmnetctl("up", "-f", h.WriteFile("vms.yaml", strings.Replace(vmsYAML, "allow: [198.51.100.2, allowed.test]", "allow: [198.51.100.2]", 1)))
	if pAfter := h.Attachment(h.Status(), "p"); pAfter.PID != pBefore.PID || pAfter.IP != pBefore.IP || pAfter.Restarts != pBefore.Restarts {
		t.Errorf("changing p's policy touched its helper or lease: pid %d, ip %s before; pid %d, ip %s after", pBefore.PID, pBefore.IP, pAfter.PID, pAfter.IP)
	}
	testutil.Eventually(t, 10*time.Second, func() error {
		if got, err := dialHello(p.NS, "198.51.100.2:7000"); got != "lan .2" {
			return fmt.Errorf("p to the address its policy still allows: got %q (%v)", got, err)
		}
		return nil
	}, "p's network after the up") // (the control)
	if got := httpGet(p, "198.51.100.3:80", "allowed.test"); strings.HasPrefix(got, "200") {
		t.Errorf("p over HTTP to allowed.test after its policy dropped the name: %q, want it refused", got)
	}

	st = h.Status()
	if got := h.Attachment(st, "s").EgressDenied; got < 3 {
		t.Errorf("s: %d refused connections counted, want 3 or more", got)
	}
	if got := h.Attachment(st, "p").EgressDenied; got < 2 {
		t.Errorf("p: %d refused connections counted, want 2 or more", got)
	}
	if got := h.Attachment(st, "o").EgressDenied; got != 0 {
		t.Errorf("o, on a network without a policy: %d refused connections counted", got)
	}
	for _, n := range st.Networks {
		if n.Name == "sandbox" && n.EgressDenied < 3 {
			t.Errorf("sandbox: %d connections counted as refused, want 3 or more", n.EgressDenied)
		}
	}
}

// serveDNS answers A and AAAA queries for names on addr (UDP) in ns: each
// name's addresses, comma-separated.
func serveDNS(t testing.TB, ns *testutil.NS, addr string, names map[string]string) {
	pc := ns.ListenPacket(t, "udp4", addr)
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		if len(r.Question) == 1 {
			q := r.Question[0]
			hdr := dns.RR_Header{Name: q.Name, Rrtype: q.Qtype, Class: dns.ClassINET, Ttl: 300}
			for _, a := range strings.Split(names[q.Name], ",") {
				ip := net.ParseIP(a)
				switch {
				case ip == nil:
				case q.Qtype == dns.TypeA && ip.To4() != nil:
					m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: ip})
				case q.Qtype == dns.TypeAAAA && ip.To4() == nil:
					m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: ip})
				}
			}
		}
		w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
}

// TestEgressDeniedEvents: a connection a VM opens that its network's
// egress policy refuses is an egress-denied event naming the VM, the
// flow and the name the VM resolved for its address; a VM flooding
// refused connections gets a few events, not one each.
func TestEgressDeniedEvents(t *testing.T) {
	h := &host{Host: simvm.NewHost(t, "vmned", egressNetworks, "pgrep"), t: t}
	lan := testutil.NewNS(t, "edlan")
	link(t, h, "lan", "198.51.100.1/24", lan, "198.51.100.2/24", "198.51.100.3/24")
	serveText(t, lan.Listen(t, "tcp4", "198.51.100.2:7000"), "lan .2")
	serveDNS(t, lan, "198.51.100.2:53", map[string]string{"nope.test.": "198.51.100.2"})
	etc := filepath.Join("/etc/netns", h.Name)
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(etc) })
	if err := os.WriteFile(filepath.Join(etc, "resolv.conf"), []byte("nameserver 198.51.100.2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h.MustVmnetctl("up", "-f", h.WriteFile("vms.yaml", "vms:\n  s:\n    networks:\n      - vmnet: sandbox\n"))
	s := h.VM(h.Attachment(h.Status(), "s"))
	lease := s.DHCP(t)
	if out, err := s.Run(context.Background(), "busybox", "nslookup", "-type=a", "nope.test", "10.88.0.1"); err != nil {
		t.Fatalf("resolving nope.test: %v\n%s", err, out)
	}
	if got, _ := dialHello(s.NS, "198.51.100.2:7000"); got != "" {
		t.Fatalf("s reached nope.test's address, which its network denies: %q", got)
	}
	denied := func() []map[string]any {
		t.Helper()
		var out []map[string]any
		for _, line := range strings.Split(strings.TrimSpace(h.MustVmnetctl("events", "--json")), "\n") {
			var ev map[string]any
			if json.Unmarshal([]byte(line), &ev) == nil && ev["kind"] == "egress-denied" {
				out = append(out, ev)
			}
		}
		return out
	}
	var first map[string]any
	testutil.Eventually(t, 10*time.Second, func() error {
		if evs := denied(); len(evs) > 0 {
			first = evs[0]
			return nil
		}
		return errors.New("no egress-denied event yet")
	}, "the refused connection's event")
	want := "tcp " + lease["ip"] + ":"
	if first["attachment"] != "s/0" || first["network"] != "sandbox" || first["ip"] != lease["ip"] ||
		!strings.HasPrefix(fmt.Sprint(first["detail"]), want) || !strings.Contains(fmt.Sprint(first["detail"]), "-> 198.51.100.2:7000 (nope.test)") {
		t.Errorf("the event: %v; want s/0 on sandbox from %s, detail %s... -> 198.51.100.2:7000 (nope.test)", first, lease["ip"], want)
	}
	// A flood of refused connections: a few events, however many tries.
	for i := range 100 {
		s.Do(func() error {
			c, err := net.DialTimeout("tcp4", fmt.Sprintf("198.51.100.3:%d", 8000+i), 20*time.Millisecond)
			if err == nil {
				c.Close()
			}
			return nil
		})
	}
	if evs := denied(); len(evs) > 4 {
		t.Errorf("100 refused connections in a burst made %d events, want a few", len(evs))
	}
}
