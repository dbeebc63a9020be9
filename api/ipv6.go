package api

import (
	"crypto/sha256"
	"fmt"
	"net"
	"net/netip"

	"gopkg.in/yaml.v3"
)

// IPv6 on shared and host networks: every one gets a /64, ULA unless set,
// with the gateway at ::1 of it on the bridge. Router advertisements give
// the VMs addresses (SLAAC); shared networks route and NAT66 it.

// ulaRange is fc00::/7 with the L bit set: locally assigned ULAs (RFC 4193).
var ulaRange = netip.MustParsePrefix("fd00::/8")

// ULAPrefix is the IPv6 /64 of the network named id when networks.yaml
// sets none: fd00::/8 with a 40-bit global ID from a hash of the name and
// subnet ID 0 (RFC 4193 asks for a random global ID; a hash of the name is
// as unlikely to collide, and is the same on every machine and every run,
// so a VM file's IPv6 addresses and a firewall rule written for them hold).
func ULAPrefix(id string) netip.Prefix {
	sum := sha256.Sum256([]byte("vmnetctl ULA " + id))
	var a [16]byte
	a[0] = 0xfd
	copy(a[1:6], sum[:5])
	return netip.PrefixFrom(netip.AddrFrom16(a), 64)
}

// HasIPv6 reports whether the network has an IPv6 side.
func (n *Network) HasIPv6() bool { return n.Routed() && n.Subnet6.IsValid() }

// RoutesIPv6 reports whether the network's IPv6 traffic leaves the host
// (through NAT66): shared networks with nat66. Only then do its router
// advertisements make the gateway a default router.
func (n *Network) RoutesIPv6() bool { return n.HasIPv6() && n.Mode == ModeShared && n.NAT66 }

// ipv6 reads `ipv6` and `subnet6` of a shared or host network; defaultIPv6
// gives the others their prefix once their ids are final.
func (w *walker) ipv6(n *Network, f map[string]*yaml.Node, at func(string) string) {
	on := true
	field(w, f, at, "ipv6", w.boolean, &on, nil)
	if !on {
		if sv, ok := f["subnet6"]; ok {
			w.warnf(sv, at("subnet6"), "has no effect with ipv6: false")
		}
		n.noIPv6 = true
		n.NAT66, n.RouterAdvertisement = false, false
		return
	}
	field(w, f, at, "subnet6", w.str, new(string), func(s string, invalid func(string, ...any)) {
		p, err := netip.ParsePrefix(s)
		switch {
		case err != nil || !p.Addr().Is6() || p.Addr().Is4In6():
			invalid("%q is not an IPv6 prefix (like fd12:3456:789a::/64)", s)
		case p.Bits() != 64:
			invalid("%s is a /%d: an IPv6 network is a /64, the size SLAAC needs", s, p.Bits())
		case p.Masked() != p:
			invalid("%s has host bits set; the network is %s", s, p.Masked())
		case !ulaRange.Contains(p.Addr()):
			invalid("%s is not a unique local prefix (fd00::/8): vmnetctl's IPv6 networks are NATed or host-only, so their prefix must not be routable", s)
		case n.MTU < IPv6MinMTU:
			invalid("IPv6 needs an MTU of at least %d; the network's is %d", IPv6MinMTU, n.MTU)
		default:
			n.Subnet6, n.Gateway6 = p, Gateway6(p)
		}
	})
}

// IPv6MinMTU is the least MTU IPv6 runs on (RFC 8200); Linux turns IPv6
// off on an interface with less.
const IPv6MinMTU = 1280

// defaultIPv6 gives each shared and host network without `subnet6` (and
// without `ipv6: false`) the ULA prefix of its final id, if its MTU
// carries IPv6.
func defaultIPv6(nets []*Network) {
	for _, n := range nets {
		if n.Routed() && !n.noIPv6 && !n.Subnet6.IsValid() && n.MTU >= IPv6MinMTU {
			n.Subnet6 = ULAPrefix(n.ID)
			n.Gateway6 = Gateway6(n.Subnet6)
		}
		if !n.HasIPv6() {
			n.NAT66, n.RouterAdvertisement = false, false
		}
	}
}

// Gateway6 is the gateway's IPv6 address in prefix: ::1.
func Gateway6(prefix netip.Prefix) netip.Addr {
	return prefix.Masked().Addr().Next()
}

// checkIPv6Overlaps reports networks whose IPv6 prefixes are the same.
func (w *walker) checkIPv6Overlaps(byLine []*Network) {
	seen := map[netip.Prefix]*Network{}
	for _, n := range byLine {
		if !n.HasIPv6() {
			continue
		}
		if p, dup := seen[n.Subnet6]; dup {
			line, field := n.lines["subnet6"], string(n.Section)+"."+n.Name+".subnet6"
			if line == 0 {
				line = n.Source.Line
			}
			w.diags = append(w.diags, Diagnostic{File: w.file, Line: line, Field: field,
				Message: fmt.Sprintf("IPv6 prefix %s is also network %q's (line %d)", n.Subnet6, p.ID, p.Source.Line)})
			continue
		}
		seen[n.Subnet6] = n
	}
}

// LinkLocal is the EUI-64 link-local address of mac, in fe80::/64 (RFC
// 4291): a VM's (which the IPv6 learner reserves for it) and a bridge's.
func LinkLocal(mac net.HardwareAddr) netip.Prefix {
	var a [16]byte
	a[0], a[1] = 0xfe, 0x80
	a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15] = mac[0]^0x02, mac[1], mac[2], 0xff, 0xfe, mac[3], mac[4], mac[5]
	return netip.PrefixFrom(netip.AddrFrom16(a), 64)
}
