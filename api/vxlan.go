package api

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// One network across several hosts: a shared or host network with a
// `vxlan:` section has, on every host that lists it, a VXLAN device on its
// bridge (the kernel's, VNI and UDP port as given) that carries the
// network's frames to the other hosts of the list (head-end replication:
// one copy per peer, no multicast). Every host holds the same gateway
// address and MAC (a distributed gateway): a VM leaves through its own
// host, and gateway, DHCP and router traffic never crosses the tunnel. Each
// host's DHCP serves its own slice of the range (VXLANHostSlice).
//
//	networks:
//	  lab:
//	    mode: shared
//	    gateway: 192.168.120.1
//	    dhcpEnd: 192.168.120.254
//	    netmask: 255.255.255.0
//	    vxlan:
//	      vni: 120
//	      hosts:
//	        - {name: rack1, address: 10.0.0.1}
//	        - {name: rack2, address: 10.0.0.2}

// VXLAN is a network's segment across hosts.
type VXLAN struct {
	// VNI is the segment's VXLAN network identifier (1 to 2^24-1).
	VNI uint32 `json:"vni"`
	// Port is the UDP port of the underlay (DefaultVXLANPort).
	Port uint16 `json:"port"`
	// Hosts are the hosts of the segment, in the order that gives each its
	// slice of the DHCP range. A host is the one whose address is its own.
	Hosts []VXLANHost `json:"hosts"`
	// UnderlayMTU is the MTU of the path between the hosts; the network's
	// MTU must leave room for VXLANOverhead in it.
	UnderlayMTU int `json:"underlayMTU"`
	// DNSPort is the UDP port, on each host's underlay address, where its
	// DNS proxy answers the other hosts for its own VMs' names.
	DNSPort uint16 `json:"dnsPort"`
	// EVPN, if set, has FRR's BGP EVPN fill the tunnel's forwarding
	// tables instead of a static flooding list (vxlan_evpn.go).
	EVPN *EVPN `json:"evpn,omitempty"`
	// WireGuard, if set, encrypts the underlay (vxlan_wireguard.go).
	WireGuard *WireGuard `json:"wireguard,omitempty"`
}

// String is the segment as plan shows it; "" for none.
func (x *VXLAN) String() string {
	if x == nil {
		return ""
	}
	var hosts []string
	for _, h := range x.Hosts {
		hosts = append(hosts, h.Name+"="+h.Address.String())
	}
	s := fmt.Sprintf("vni %d port %d dnsPort %d underlayMTU %d hosts %s", x.VNI, x.Port, x.DNSPort, x.UnderlayMTU, strings.Join(hosts, ","))
	if x.EVPN != nil {
		s += " " + x.EVPN.String()
	}
	return s + x.wireGuardString()
}

// VXLANHost is one host of a segment: a name for humans, and its underlay
// address, which the other hosts send the tunnel's packets to.
type VXLANHost struct {
	Name    string     `json:"name"`
	Address netip.Addr `json:"address"`
	// PublicKey is the host's WireGuard key (base64), with vxlan.wireguard.
	PublicKey string `json:"publicKey,omitempty"`
}

const (
	// DefaultVXLANPort is IANA's VXLAN port.
	DefaultVXLANPort = 4789
	// DefaultVXLANDNSPort is where hosts of a segment ask each other for
	// their VMs' names.
	DefaultVXLANDNSPort = 5380
	// VXLANOverhead is what VXLAN over IPv4 adds to a frame: outer IPv4
	// (20), UDP (8), VXLAN (8) and the inner Ethernet header (14).
	VXLANOverhead = 50
	maxVNI        = 1<<24 - 1
)

var vxlanKeys = []string{"vni", "port", "hosts", "underlayMTU", "dnsPort", "evpn", "wireguard"}

// vxlan reads a shared or host network's `vxlan:` section; mtuSet says
// whether networks.yaml gave the network's MTU (else it is lowered to fit).
func (w *walker) vxlan(n *Network, v *yaml.Node, path string, mtuSet bool) {
	f, _, ok := w.collect(deref(v), path, vxlanKeys)
	if !ok {
		return
	}
	at := func(k string) string { return joinPath(path, k) }
	key := &yaml.Node{Line: n.lines["vxlan"]} // what the section as a whole is reported at
	x := &VXLAN{Port: DefaultVXLANPort, UnderlayMTU: DefaultMTU, DNSPort: DefaultVXLANDNSPort}
	vni := 0
	if _, ok := f["vni"]; !ok {
		w.errorf(key, at("vni"), "is required: the segment's VXLAN id, the same on every host (1 to %d)", maxVNI)
	}
	field(w, f, at, "vni", w.integer, &vni, func(i int, invalid func(string, ...any)) {
		if i < 1 || i > maxVNI {
			invalid("%d is outside 1-%d", i, maxVNI)
		}
	})
	x.VNI = uint32(vni)
	for _, p := range []struct {
		key string
		dst *uint16
	}{{"port", &x.Port}, {"dnsPort", &x.DNSPort}} {
		port := int(*p.dst)
		field(w, f, at, p.key, w.integer, &port, func(i int, invalid func(string, ...any)) {
			if i < 1 || i > 65535 {
				invalid("%d is not a UDP port", i)
			}
		})
		*p.dst = uint16(port)
	}
	if x.Port == x.DNSPort {
		w.errorf(key, at("dnsPort"), "%d is also the tunnel's port", x.DNSPort)
	}
	field(w, f, at, "underlayMTU", w.integer, &x.UnderlayMTU, func(i int, invalid func(string, ...any)) {
		if i < MinMTU+VXLANOverhead || i > MaxMTU {
			invalid("%d is outside %d-%d", i, MinMTU+VXLANOverhead, MaxMTU)
		}
	})
	x.Hosts = w.vxlanHosts(f["hosts"], at("hosts"), key)
	x.EVPN = w.evpn(f["evpn"], at("evpn")) // vxlan_evpn.go
	w.wireGuard(n, x, f, at, key)
	if x.EVPN != nil && x.WireGuard != nil {
		w.errorf(key, at("evpn"), "and wireguard together are not supported yet: BGP EVPN over an encrypted underlay is untested; use one or the other")
	}
	switch room := x.FrameMTU(); {
	case !mtuSet:
		// The network's frames must fit the tunnel: no black hole for
		// full-size frames.
		n.MTU = min(n.MTU, room)
	case n.MTU > room:
		w.errorf(key, path, "the network's mtu %d does not fit the tunnel: %s and the underlay's MTU is %d; set mtu to at most %d, or underlayMTU to at least %d (and raise the hosts' interfaces to it)",
			n.MTU, x.overheadText(), x.UnderlayMTU, room, n.MTU+x.Overhead())
	}
	if n.Subnet6.IsValid() && n.MTU < IPv6MinMTU {
		// subnet6 was checked against the MTU before the tunnel lowered it.
		w.errorf(key, path, "the tunnel leaves the network an MTU of %d, below IPv6's %d, and subnet6 is set: raise underlayMTU to at least %d, or set ipv6: false",
			n.MTU, IPv6MinMTU, IPv6MinMTU+x.Overhead())
	}
	if n.DHCPStart.IsValid() && len(x.Hosts) > 0 {
		if size := addrDistance(n.DHCPStart, n.DHCPEnd) + 1; size < uint64(len(x.Hosts)) {
			w.errorf(key, at("hosts"), "%d hosts cannot share a DHCP range of %d addresses: each host serves a slice of it", len(x.Hosts), size)
		}
	}
	n.VXLAN = x
}

// vxlanHosts reads the hosts of a segment: a list of {name, address}, each
// name a DNS label and each IPv4 address once.
func (w *walker) vxlanHosts(v *yaml.Node, path string, section *yaml.Node) []VXLANHost {
	if v == nil {
		w.errorf(section, path, "is required: the hosts of the segment, each {name: NAME, address: UNDERLAY-IPv4}")
		return nil
	}
	v = deref(v)
	if v.Kind != yaml.SequenceNode || len(v.Content) == 0 {
		w.errorf(v, path, "must be a list of hosts, each {name: NAME, address: UNDERLAY-IPv4}, not %s", kindName(v))
		return nil
	}
	var hosts []VXLANHost
	names, addrs := map[string]int{}, map[netip.Addr]int{}
	for i, item := range v.Content {
		p := fmt.Sprintf("%s[%d]", path, i)
		f, _, ok := w.collect(deref(item), p, []string{"name", "address", "publicKey"})
		if !ok {
			continue
		}
		at := func(k string) string { return joinPath(p, k) }
		var h VXLANHost
		for _, k := range []string{"name", "address"} {
			if _, ok := f[k]; !ok {
				w.errorf(item, at(k), "is required")
			}
		}
		field(w, f, at, "name", w.str, &h.Name, func(s string, invalid func(string, ...any)) {
			if msg := checkName(s); msg != "" {
				invalid("host name %s", msg)
			} else if prev, dup := names[s]; dup {
				invalid("host %s is listed twice (first at line %d)", s, prev)
			}
		})
		if av, ok := f["address"]; ok {
			if a, ok := w.ipv4(av, at("address")); ok {
				switch prev, dup := addrs[a]; {
				case dup:
					w.errorf(av, at("address"), "%s is listed twice (first at line %d)", a, prev)
				case !a.IsGlobalUnicast() && !a.IsPrivate():
					w.errorf(av, at("address"), "%s is not a unicast address a host can have", a)
				}
				h.Address = a
				addrs[a] = av.Line
			}
		}
		h.PublicKey = w.wireGuardHostKey(f, at)
		names[h.Name] = item.Line
		hosts = append(hosts, h)
	}
	return hosts
}

// checkVXLANs checks what spans the segments of a file: a VNI is one
// network's.
func (w *walker) checkVXLANs(nets []*Network) {
	byVNI := map[uint32]*Network{}
	for _, n := range nets {
		if n.VXLAN == nil {
			continue
		}
		if prev, dup := byVNI[n.VXLAN.VNI]; dup {
			w.diags = append(w.diags, Diagnostic{File: w.file, Line: n.Source.Line, Field: string(n.Section) + "." + n.Name + ".vxlan.vni",
				Message: fmt.Sprintf("VNI %d is also network %q's (line %d)", n.VXLAN.VNI, prev.ID, prev.Source.Line)})
			continue
		}
		byVNI[n.VXLAN.VNI] = n
	}
	w.checkEVPNs(nets) // vxlan_evpn.go
}

// VXLANHostSlice is the part of n's DHCP range that host i of its segment
// serves: the range cut into as many equal runs as there are hosts, the
// last taking what is left. Hosts never hand out the same address, so no
// lease needs agreeing on; reservations (the same file everywhere) are
// honoured on any host.
func (n *Network) VXLANHostSlice(i int) (start, end netip.Addr) {
	hosts := len(n.VXLAN.Hosts)
	size := addrDistance(n.DHCPStart, n.DHCPEnd) + 1
	per := size / uint64(hosts)
	start = addAddr(n.DHCPStart, per*uint64(i))
	end = n.DHCPEnd
	if i < hosts-1 {
		end = addAddr(start, per-1)
	}
	return start, end
}

// VXLANHostIndex is the index of the host among n's segment hosts whose
// underlay address is one of local; -1 when none is.
func (n *Network) VXLANHostIndex(local []netip.Addr) int {
	for i, h := range n.VXLAN.Hosts {
		if slices.Contains(local, h.Address) {
			return i
		}
	}
	return -1
}

// addrDistance is b - a for IPv4 addresses a <= b.
func addrDistance(a, b netip.Addr) uint64 {
	return uint64(u32(b)) - uint64(u32(a))
}

// addAddr is a + k for an IPv4 address a.
func addAddr(a netip.Addr, k uint64) netip.Addr {
	v := uint32(uint64(u32(a)) + k)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func u32(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}
