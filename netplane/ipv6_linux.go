package netplane

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/hostnet"
)

// The IPv6 side of a shared or host network (api.Network.HasIPv6): the
// gateway's address Gateway6/64 on the bridge, router advertisements
// (ra_linux.go) for SLAAC, and for shared networks with nat66 forwarding
// and NAT66 (nftRules).

// ipv6On reports whether n's bridge gets its IPv6 side: n has one and the
// host runs IPv6.
func ipv6On(n *api.Network) bool { return n.HasIPv6() && hostnet.KernelIPv6() }

// bridgeIPv6Sysctls are set on a network's bridge before it goes up: the
// gateway is the network's router, so it accepts no router advertisement
// (and makes no address from one), and runs no duplicate address
// detection: a bridge without ports has no carrier, and DAD would keep its
// link-local address tentative, unusable for the advertisements, until a
// VM came.
func bridgeIPv6Sysctls(n *api.Network, name string) error {
	if !hostnet.KernelIPv6() {
		return nil
	}
	if !n.HasIPv6() {
		return hostnet.EnsureSysctl(hostnet.IPv6Conf(name, "disable_ipv6"), "1")
	}
	for _, kv := range [][2]string{{"accept_dad", "0"}, {"accept_ra", "0"}, {"autoconf", "0"}, {"disable_ipv6", "0"}} {
		if err := hostnet.EnsureSysctl(hostnet.IPv6Conf(name, kv[0]), kv[1]); err != nil {
			return fmt.Errorf("network %q: setting net.ipv6.conf.%s.%s=%s: %w", n.ID, name, kv[0], kv[1], err)
		}
	}
	return nil
}

// ensureAddr6 gives n's bridge the gateway's IPv6 address and no other
// global one, and its link-local address (router advertisements come from
// it), made from BridgeMAC as the kernel would make it, but at once: the
// kernel adds it only when the bridge has carrier, that is once a VM
// joined, and the advertisements must be ready before.
func ensureAddr6(n *api.Network, br netlink.Link) error {
	if !ipv6On(n) {
		return nil
	}
	if err := hostnet.AddAddr(n, br, api.LinkLocal(hostnet.BridgeMAC(n.ID))); err != nil {
		return err
	}
	return ensureOnlyAddr(n, br, netip.PrefixFrom(n.Gateway6, 64), netip.Addr.IsLinkLocalUnicast)
}

// ensureIPv6Forwarding turns IPv6 forwarding on for NAT66. Linux then
// ignores router advertisements on every interface whose accept_ra is 1,
// and a host that has its own IPv6 default route from one (a laptop on
// most LANs) would lose it when it expires; accept_ra=2 accepts them while
// forwarding, which is what such an interface did before. So each
// interface at 1 (and "default", for interfaces made later) is set to 2
// first, as LXD does; the rest is left alone, and Remove leaves all of it
// (other software may rely on forwarding, as for IPv4).
func ensureIPv6Forwarding() error {
	if IPv6Forwarding() {
		return nil
	}
	ifaces, err := InterfacesAcceptingRA()
	if err != nil {
		return err
	}
	for _, name := range ifaces {
		if err := os.WriteFile(hostnet.IPv6Conf(name, "accept_ra"), []byte("2"), 0o644); err != nil {
			return fmt.Errorf("keeping router advertisements on %s (accept_ra=2): %w", name, err)
		}
	}
	return os.WriteFile(hostnet.IPv6Conf("all", "forwarding"), []byte("1"), 0o644)
}

// IPv6Forwarding reports whether the host forwards IPv6.
func IPv6Forwarding() bool {
	v, err := os.ReadFile(hostnet.IPv6Conf("all", "forwarding"))
	return err == nil && string(bytes.TrimSpace(v)) == "1"
}

// InterfacesAcceptingRA lists the interfaces (and "default", for those
// made later) whose accept_ra is 1: those that turning IPv6 forwarding on
// sets to 2 (lo takes no advertisements).
func InterfacesAcceptingRA() ([]string, error) {
	dirs, err := os.ReadDir("/proc/sys/net/ipv6/conf")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, d := range dirs {
		if d.Name() == "all" || d.Name() == "lo" {
			continue
		}
		if v, err := os.ReadFile(hostnet.IPv6Conf(d.Name(), "accept_ra")); err == nil && string(bytes.TrimSpace(v)) == "1" {
			out = append(out, d.Name())
		}
	}
	return out, nil
}

// checkIPv6 is Check's part for n's IPv6 side: the bridge's address, and
// forwarding for a network that routes IPv6.
func checkIPv6(n *api.Network, br netlink.Link) []error {
	if !ipv6On(n) || br == nil {
		return nil
	}
	var errs []error
	addrs, err := hostnet.AddrsOf(br, netlink.FAMILY_V6)
	if err != nil {
		return []error{fmt.Errorf("network %q: listing IPv6 addresses of %s: %w", n.ID, br.Attrs().Name, err)}
	}
	want := netip.PrefixFrom(n.Gateway6, 64)
	found := false
	for _, a := range addrs {
		p, ok := hostnet.AddrPrefix(a.IPNet)
		found = found || (ok && p == want)
	}
	if !found {
		errs = append(errs, fmt.Errorf("network %q: bridge %s does not have %s", n.ID, br.Attrs().Name, want))
	}
	if n.RoutesIPv6() {
		if !IPv6Forwarding() {
			errs = append(errs, fmt.Errorf("network %q: IPv6 forwarding is off", n.ID))
		}
	}
	return errs
}
