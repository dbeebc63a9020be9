package controller_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/test/simvm"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// The IPv6 world of TestIPv6: the host's uplink and a WAN peer on a
// documentation prefix, inside the test's namespaces only. The WAN has no
// route to the networks' prefixes: a reply comes back only through NAT66.
const (
	ipv6Networks = `
vmnet:
  shared:
    subnet: 10.77.0.0/24
    subnet6: fd00:77::/64
  host:
    mode: host
    subnet: 10.78.0.0/24
    subnet6: fd00:78::/64
  nora:
    mode: host
    subnet: 10.79.0.0/24
    routerAdvertisement: false
`
	ipv6VMs = `
vms:
  a:
    networks:
      - vmnet: shared
  c:
    networks:
      - vmnet: host
  d:
    networks:
      - vmnet: nora
`
	wan6Host = "2001:db8:100::1"
	wan6Peer = "2001:db8:100::2"
)

// TestIPv6: VMs get addresses by SLAAC from the networks' router
// advertisements and reach their gateway over IPv6 (DNS too); on a shared
// network the default route leads to a WAN through NAT66; on a host-only
// network there is no default route, and one added by hand leads nowhere;
// with routerAdvertisement: false there is no address.
func TestIPv6(t *testing.T) {
	h := &host{Host: simvm.NewHost(t, "vmn6", ipv6Networks, "pgrep"), t: t}
	wan := testutil.NewNS(t, "wan6")
	testutil.Run(t, "ip", "-n", h.Name, "link", "add", "uplink", "type", "veth", "peer", "name", "eth0", "netns", wan.Name)
	h.MustRun(t, "ip", "addr", "add", wan6Host+"/64", "dev", "uplink", "nodad")
	h.MustRun(t, "ip", "link", "set", "uplink", "up")
	h.MustRun(t, "ip", "-6", "route", "add", "default", "via", wan6Peer)
	wan.MustRun(t, "ip", "addr", "add", wan6Peer+"/64", "dev", "eth0", "nodad")
	wan.MustRun(t, "ip", "link", "set", "eth0", "up")

	h.MustVmnetctl("up", "-f", h.WriteFile("vms.yaml", ipv6VMs))
	st := h.Status()
	a, c, d := h.VM(h.Attachment(st, "a")), h.VM(h.Attachment(st, "c")), h.VM(h.Attachment(st, "d"))
	lease := a.DHCP(t) // first: its script flushes eth0's addresses
	a6 := slaacAddress(t, a, "fd00:77::/64")
	slaacAddress(t, c, "fd00:78::/64")

	if err := a.Ping("fd00:77::1", 1); err != nil {
		t.Errorf("a cannot reach its IPv6 gateway: %v", err)
	}
	if out, _ := a.Run(context.Background(), "ip", "-6", "route", "show", "default"); !strings.Contains(out, "via fe80:") {
		t.Errorf("a has no default route from the router advertisement: %q", out)
	}
	if err := a.Ping(wan6Peer, 1); err != nil {
		t.Errorf("a does not reach the WAN through NAT66: %v", err)
	}
	out, err := a.Run(context.Background(), "busybox", "nslookup", "a.vmnet.internal", "fd00:77::1")
	if err != nil || !strings.Contains(out, lease["ip"]) {
		t.Errorf("DNS over IPv6 from a: %v\n%s", err, out)
	}

	if err := c.Ping("fd00:78::1", 1); err != nil {
		t.Errorf("c cannot reach its IPv6 gateway on the host network: %v", err)
	}
	if out, _ := c.Run(context.Background(), "ip", "-6", "route", "show", "default"); strings.TrimSpace(out) != "" {
		t.Errorf("c on a host network has a default route: %q", out)
	}
	c.MustRun(t, "ip", "-6", "route", "add", "default", "via", "fd00:78::1")
	if err := c.Ping(wan6Peer, 1); err == nil {
		t.Errorf("c on a host network reached the WAN over IPv6")
	}

	// By now a and c have had their advertisements; d, on a network
	// without them, has no address in any prefix.
	if out, _ := d.Run(context.Background(), "ip", "-6", "-o", "addr", "show", "dev", "eth0", "scope", "global"); strings.TrimSpace(out) != "" {
		t.Errorf("d on a network with routerAdvertisement: false has %q", out)
	}
	t.Logf("a's address: %s", a6)
}

// slaacAddress waits for vm's eth0 to have a global address in prefix
// (SLAAC from the network's router advertisements) and returns it.
func slaacAddress(t *testing.T, vm *simvm.VM, prefix string) netip.Addr {
	t.Helper()
	p := netip.MustParsePrefix(prefix)
	var got netip.Addr
	testutil.Eventually(t, 30*time.Second, func() error {
		out, err := vm.Run(context.Background(), "ip", "-6", "-o", "addr", "show", "dev", "eth0", "scope", "global")
		if err != nil {
			return err
		}
		for _, f := range strings.Fields(out) {
			if pf, err := netip.ParsePrefix(f); err == nil && p.Contains(pf.Addr()) && !strings.Contains(out, "tentative") {
				got = pf.Addr()
				return nil
			}
		}
		return fmt.Errorf("%s has no address in %s: %q", vm.Name, prefix, out)
	}, "a SLAAC address")
	return got
}
