package controller_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/vmnetctl/vmnetctl/test/simvm"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

const egressNetworks = `
vmnet:
  sandbox:
    subnet: 10.88.0.0/24
    egress:
      default: deny
      allow: [198.51.100.0/24]
      deny: [198.51.100.3, host]
  open:
    subnet: 10.89.0.0/24
`

// TestEgress: a network's egress policy decides what its VMs connect to,
// the longest prefix first: an allowed /24 is reached, a denied address in
// it is not, nor what the default denies, nor the host's own services
// (DNS on the gateway still answers); a network without a policy reaches
// all of them; the refusals are counted.
func TestEgress(t *testing.T) {
	h := &host{Host: simvm.NewHost(t, "vmneg", egressNetworks, "pgrep"), t: t}
	lan := testutil.NewNS(t, "eglan")
	testutil.Run(t, "ip", "-n", h.Name, "link", "add", "lan", "type", "veth", "peer", "name", "eth0", "netns", lan.Name)
	h.MustRun(t, "ip", "addr", "add", "198.51.100.1/24", "dev", "lan")
	h.MustRun(t, "ip", "link", "set", "lan", "up")
	for _, a := range []string{"198.51.100.2/24", "198.51.100.3/24"} {
		lan.MustRun(t, "ip", "addr", "add", a, "dev", "eth0")
	}
	lan.MustRun(t, "ip", "link", "set", "eth0", "up")
	wan := testutil.NewNS(t, "egwan")
	testutil.Run(t, "ip", "-n", h.Name, "link", "add", "uplink", "type", "veth", "peer", "name", "eth0", "netns", wan.Name)
	h.MustRun(t, "ip", "addr", "add", "203.0.113.1/24", "dev", "uplink")
	h.MustRun(t, "ip", "link", "set", "uplink", "up")
	h.MustRun(t, "ip", "route", "add", "default", "via", "203.0.113.2")
	wan.MustRun(t, "ip", "addr", "add", "203.0.113.2/24", "dev", "eth0")
	wan.MustRun(t, "ip", "link", "set", "eth0", "up")
	serveText(t, lan.Listen(t, "tcp4", "198.51.100.2:7000"), "lan .2")
	serveText(t, lan.Listen(t, "tcp4", "198.51.100.3:7000"), "lan .3")
	serveText(t, wan.Listen(t, "tcp4", "203.0.113.2:7000"), "internet")
	serveText(t, h.Listen(t, "tcp4", "0.0.0.0:7100"), "host service")

	h.MustVmnetctl("up", "-f", h.WriteFile("vms.yaml", "vms:\n  s:\n    networks:\n      - vmnet: sandbox\n  o:\n    networks:\n      - vmnet: open\n"))
	st := h.Status()
	s, o := h.VM(h.Attachment(st, "s")), h.VM(h.Attachment(st, "o"))
	s.DHCP(t)
	o.DHCP(t)

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
	} {
		wg.Go(func() {
			got, err := dialHello(c.vm.NS, c.addr)
			if got != c.want {
				t.Errorf("%s to %s (%s): got %q (%v), want %q", c.vm.Name, c.addr, c.where, got, err, c.want)
			}
		})
	}
	wg.Wait()
	if out, err := s.Run(context.Background(), "busybox", "nslookup", "s.vmnet.internal", "10.88.0.1"); err != nil || !strings.Contains(out, "10.88.0.") {
		t.Errorf("DNS on the gateway, with the host denied: %v\n%s", err, out)
	}
	for _, n := range h.Status().Networks {
		if n.Name == "sandbox" && n.EgressDenied < 3 {
			t.Errorf("sandbox: %d connections counted as refused, want 3 or more", n.EgressDenied)
		}
	}
}
