package api

import (
	"fmt"
	"math"

	"gopkg.in/yaml.v3"
)

// A segment's forwarding tables can come from BGP EVPN instead of the
// static list of peers: with `evpn:` in a network's `vxlan:` section,
// vmnetctl leaves the tunnel's flooding list and its remote MACs to FRR
// (its zebra installs them from the other hosts' type-2 and type-3 routes)
// and writes FRR the BGP sessions to the other hosts of the list (iBGP, one
// AS, l2vpn evpn, advertise-all-vni). The hosts still give each host its
// DHCP slice, its name service peers and its tunnel guard.
//
//	vxlan:
//	  vni: 120
//	  hosts: [...]
//	  evpn: {asn: 65000}

// EVPN is a segment whose forwarding tables FRR's BGP EVPN fills.
type EVPN struct {
	// ASN is the BGP autonomous system of the segment's hosts: every host
	// peers with each other one in it (iBGP). DefaultEVPNASN if not given.
	ASN uint32 `json:"asn"`
}

// DefaultEVPNASN is a private AS number (RFC 6996), the one FRR's EVPN examples use.
const DefaultEVPNASN = 65000

var evpnKeys = []string{"asn"}

// evpn reads a `vxlan.evpn:` section: a mapping, possibly empty.
func (w *walker) evpn(v *yaml.Node, path string) *EVPN {
	if v == nil {
		return nil
	}
	e := &EVPN{ASN: DefaultEVPNASN}
	if d := deref(v); d.Kind == yaml.ScalarNode && d.Tag == "!!null" {
		return e // `evpn:` alone: the defaults
	}
	f, _, ok := w.collect(deref(v), path, evpnKeys)
	if !ok {
		return e
	}
	at := func(k string) string { return joinPath(path, k) }
	asn := int(e.ASN)
	field(w, f, at, "asn", w.integer, &asn, func(i int, invalid func(string, ...any)) {
		if i < 1 || int64(i) > math.MaxUint32 || i == 23456 {
			invalid("%d is not a BGP AS number (1-4294967295, not 23456)", i)
		}
	})
	e.ASN = uint32(asn)
	return e
}

// checkEVPNs checks what spans the EVPN segments of a file: a host runs one
// BGP router, so every EVPN segment has the same AS.
func (w *walker) checkEVPNs(nets []*Network) {
	var first *Network
	for _, n := range nets {
		if n.VXLAN == nil || n.VXLAN.EVPN == nil {
			continue
		}
		if first == nil {
			first = n
			continue
		}
		if n.VXLAN.EVPN.ASN != first.VXLAN.EVPN.ASN {
			w.diags = append(w.diags, Diagnostic{File: w.file, Line: n.Source.Line, Field: string(n.Section) + "." + n.Name + ".vxlan.evpn.asn",
				Message: fmt.Sprintf("AS %d differs from network %q's AS %d (line %d): a host runs one BGP router, so every EVPN segment has one AS",
					n.VXLAN.EVPN.ASN, first.ID, first.VXLAN.EVPN.ASN, first.Source.Line)})
		}
	}
}

// String is the EVPN settings as plan shows them; "" for none.
func (e *EVPN) String() string {
	if e == nil {
		return ""
	}
	return fmt.Sprintf("evpn asn %d", e.ASN)
}
