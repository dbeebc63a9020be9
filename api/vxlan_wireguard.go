package api

import (
	"encoding/base64"
	"fmt"
	"net/netip"
	"strings"

	"gopkg.in/yaml.v3"
)

// A segment's underlay encrypted with WireGuard: `vxlan.wireguard` gives
// every host of the segment a WireGuard device (WireGuardName) with a
// tunnel address in the section's subnet (TunnelAddr), and the segment's
// VXLAN packets and the hosts' name service travel between the tunnel
// addresses, inside WireGuard. Each host entry carries its public key;
// each host's private key stays in its state dir.
//
//	vxlan:
//	  vni: 120
//	  wireguard: {port: 51820, subnet: 10.255.120.0/24}
//	  hosts:
//	    - {name: rack1, address: 10.0.0.1, publicKey: "kY1...="}
//	    - {name: rack2, address: 10.0.0.2, publicKey: "p0Q...="}

// WireGuard is the encryption of a segment's underlay.
type WireGuard struct {
	// Port is the UDP port each host's WireGuard device listens on, on
	// its underlay address (DefaultWireGuardPort).
	Port uint16 `json:"port"`
	// Subnet holds the hosts' tunnel addresses: host i has its (i+1)th
	// address (TunnelAddr).
	Subnet netip.Prefix `json:"subnet"`
}

const (
	// DefaultWireGuardPort is WireGuard's customary port.
	DefaultWireGuardPort = 51820
	// WireGuardOverhead is what WireGuard over IPv4 adds to a packet:
	// outer IPv4 (20), UDP (8), WireGuard's data header (16) and its
	// authentication tag (16). Its padding of the plaintext to 16 bytes
	// stops at the device's MTU, so it takes no more room.
	WireGuardOverhead = 60
	// WireGuardKeyLen is the length of a Curve25519 key.
	WireGuardKeyLen = 32
)

var wireGuardKeys = []string{"port", "subnet"}

// WireGuardPrefix starts the name of a segment's WireGuard device.
const WireGuardPrefix = "vmw-"

// WireGuardName is the WireGuard device of network networkID: its
// bridge's name with WireGuardPrefix for BridgePrefix.
func WireGuardName(networkID string) string {
	return WireGuardPrefix + strings.TrimPrefix(BridgeName(networkID), BridgePrefix)
}

// TunnelAddr is the address host i of the segment sends and receives the
// segment's VXLAN packets and name queries on: its underlay address, or,
// with WireGuard, the (i+1)th address of the WireGuard subnet.
func (x *VXLAN) TunnelAddr(i int) netip.Addr {
	if x.WireGuard == nil {
		return x.Hosts[i].Address
	}
	return addAddr(x.WireGuard.Subnet.Addr(), uint64(i)+1)
}

// Overhead is what the tunnel adds to a frame: VXLAN's, and WireGuard's
// if the underlay is encrypted.
func (x *VXLAN) Overhead() int {
	if x.WireGuard == nil {
		return VXLANOverhead
	}
	return VXLANOverhead + WireGuardOverhead
}

// overheadText says what Overhead is made of, for error messages.
func (x *VXLAN) overheadText() string {
	if x.WireGuard == nil {
		return fmt.Sprintf("VXLAN adds %d bytes", VXLANOverhead)
	}
	return fmt.Sprintf("VXLAN and WireGuard add %d bytes (%d and %d)", x.Overhead(), VXLANOverhead, WireGuardOverhead)
}

// FrameMTU is the MTU of the segment's VXLAN device: the largest frame,
// less its Ethernet header, that the underlay carries in one packet.
func (x *VXLAN) FrameMTU() int { return x.UnderlayMTU - x.Overhead() }

// WireGuardMTU is the MTU of the segment's WireGuard device.
func (x *VXLAN) WireGuardMTU() int { return x.UnderlayMTU - WireGuardOverhead }

// wireGuardString is the WireGuard part of VXLAN.String: what plan
// compares.
func (x *VXLAN) wireGuardString() string {
	if x.WireGuard == nil {
		return ""
	}
	var keys []string
	for _, h := range x.Hosts {
		keys = append(keys, h.Name+"="+h.PublicKey)
	}
	return fmt.Sprintf(" wireguard port %d subnet %s keys %s", x.WireGuard.Port, x.WireGuard.Subnet, strings.Join(keys, ","))
}

// ParseWireGuardKey reads a WireGuard key as wg(8) writes it: 32 bytes in
// standard base64.
func ParseWireGuardKey(s string) ([WireGuardKeyLen]byte, error) {
	var k [WireGuardKeyLen]byte
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(b) != WireGuardKeyLen {
		return k, fmt.Errorf("%q is not a WireGuard key (%d bytes in base64, 44 characters ending in =, as `vmnetctl wireguard pubkey` prints it)", brief(s), WireGuardKeyLen)
	}
	copy(k[:], b)
	return k, nil
}

// wireGuardHostKey reads a host entry's publicKey; "" without one.
func (w *walker) wireGuardHostKey(f map[string]*yaml.Node, at func(string) string) string {
	key := ""
	field(w, f, at, "publicKey", w.str, &key, func(s string, invalid func(string, ...any)) {
		if _, err := ParseWireGuardKey(s); err != nil {
			invalid("%v", err)
		}
	})
	return key
}

// wireGuard reads a segment's `wireguard:` section (x's hosts read) and
// checks the hosts' keys against it: each host has one with WireGuard, and
// none without, and no two hosts share one.
func (w *walker) wireGuard(n *Network, x *VXLAN, f map[string]*yaml.Node, at func(string) string, section *yaml.Node) {
	hostsAt := func(i int) string { return fmt.Sprintf("%s[%d].publicKey", at("hosts"), i) }
	hostNode := func(i int) *yaml.Node {
		if hv := f["hosts"]; hv != nil && i < len(deref(hv).Content) {
			return deref(hv).Content[i]
		}
		return section
	}
	v, on := f["wireguard"]
	if !on {
		for i, h := range x.Hosts {
			if h.PublicKey != "" {
				w.errorf(hostNode(i), hostsAt(i), "is a WireGuard key, and the segment has no wireguard section: add one (wireguard: {subnet: ...}) or remove the key")
			}
		}
		return
	}
	path := at("wireguard")
	g, _, ok := w.collect(deref(v), path, wireGuardKeys)
	if !ok {
		return
	}
	gat := func(k string) string { return joinPath(path, k) }
	wg := &WireGuard{Port: DefaultWireGuardPort}
	port := int(wg.Port)
	field(w, g, gat, "port", w.integer, &port, func(i int, invalid func(string, ...any)) {
		switch {
		case i < 1 || i > 65535:
			invalid("%d is not a UDP port", i)
		case i == int(x.Port):
			invalid("%d is also the tunnel's VXLAN port", i)
		case i == int(x.DNSPort):
			invalid("%d is also the hosts' dnsPort", i)
		}
	})
	wg.Port = uint16(port)
	if x.UnderlayMTU-VXLANOverhead-WireGuardOverhead < MinMTU {
		w.errorf(section, at("underlayMTU"), "%d leaves no room for a frame of %d bytes inside VXLAN (%d) and WireGuard (%d): raise it to at least %d",
			x.UnderlayMTU, MinMTU, VXLANOverhead, WireGuardOverhead, MinMTU+VXLANOverhead+WireGuardOverhead)
	}
	if _, ok := g["subnet"]; !ok {
		w.errorf(v, gat("subnet"), "is required: an IPv4 prefix for the hosts' tunnel addresses (like 10.255.0.0/24), the same on every host and used by nothing else")
	}
	field(w, g, gat, "subnet", w.str, new(string), func(s string, invalid func(string, ...any)) {
		p, err := netip.ParsePrefix(s)
		switch {
		case err != nil || !p.Addr().Is4():
			invalid("%q is not an IPv4 prefix (like 10.255.0.0/24)", s)
		case p.Masked() != p:
			invalid("%s has host bits set; the prefix is %s", s, p.Masked())
		case p.Bits() > 30 || len(x.Hosts)+2 > 1<<(32-p.Bits()):
			invalid("%s has room for %d hosts, and the segment has %d: each host takes one address of it", s, max(0, 1<<(32-min(p.Bits(), 32))-2), len(x.Hosts))
		case n.Subnet.IsValid() && p.Overlaps(n.Subnet):
			invalid("%s overlaps the network's own subnet %s", s, n.Subnet)
		default:
			wg.Subnet = p
		}
	})
	keys := map[string]int{}
	for i, h := range x.Hosts {
		switch prev, dup := keys[h.PublicKey]; {
		case h.PublicKey == "":
			w.errorf(hostNode(i), hostsAt(i), "is required with wireguard: host %s's public key, which `vmnetctl wireguard pubkey` prints on it", h.Name)
		case dup:
			w.errorf(hostNode(i), hostsAt(i), "is also host %s's key: each host has its own", x.Hosts[prev].Name)
		default:
			keys[h.PublicKey] = i
		}
	}
	x.WireGuard = wg
}

// checkWireGuards checks what spans the encrypted segments of a file: each
// has its own WireGuard port and tunnel subnet, since each has its own
// device on every host.
func (w *walker) checkWireGuards(nets []*Network) {
	var seen []*Network
	for _, n := range nets {
		if n.VXLAN == nil || n.VXLAN.WireGuard == nil {
			continue
		}
		g := n.VXLAN.WireGuard
		for _, prev := range seen {
			pg := prev.VXLAN.WireGuard
			var msg string
			switch {
			case pg.Port == g.Port:
				msg = fmt.Sprintf("port %d is also network %q's (line %d): each encrypted segment has its own", g.Port, prev.ID, prev.Source.Line)
			case g.Subnet.IsValid() && pg.Subnet.IsValid() && pg.Subnet.Overlaps(g.Subnet):
				msg = fmt.Sprintf("subnet %s overlaps network %q's %s (line %d)", g.Subnet, prev.ID, pg.Subnet, prev.Source.Line)
			default:
				continue
			}
			w.diags = append(w.diags, Diagnostic{File: w.file, Line: n.Source.Line, Field: string(n.Section) + "." + n.Name + ".vxlan.wireguard", Message: msg})
			break
		}
		seen = append(seen, n)
	}
}
