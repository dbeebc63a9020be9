package hostnet

import (
	"errors"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"

	"github.com/vmnetctl/vmnetctl/rtlink"
)

// AddrsOf lists the addresses of family (netlink.FAMILY_V4 or FAMILY_V6)
// on link (none if it is gone), as netlink.AddrList would, in a dump the
// kernel filters by the link's index (rtlink.Addrs): netlink.AddrList
// asks for every address of the host, and the kernel walks every link
// for it.
func AddrsOf(link netlink.Link, family int) ([]netlink.Addr, error) {
	index := link.Attrs().Index
	if index == 0 {
		var err error
		switch index, err = rtlink.Index(link.Attrs().Name); {
		case errors.Is(err, rtlink.ErrGone):
			return nil, nil // (no link, no address)
		case err != nil:
			return nil, err
		}
	}
	addrs, err := rtlink.Addrs(index, uint8(family))
	if err != nil {
		return nil, err
	}
	out := make([]netlink.Addr, 0, len(addrs))
	for _, a := range addrs {
		na := netlink.Addr{IPNet: ipNet(a.Prefix), Peer: ipNet(a.Peer), Label: a.Label,
			Flags: int(a.Flags), Scope: int(a.Scope), LinkIndex: index,
			PreferedLft: int(a.PreferredLft), ValidLft: int(a.ValidLft)}
		if a.Broadcast.IsValid() {
			na.Broadcast = net.IP(a.Broadcast.AsSlice())
		}
		out = append(out, na)
	}
	return out, nil
}

// ipNet is p as package net has it; nil for no prefix.
func ipNet(p netip.Prefix) *net.IPNet {
	if !p.IsValid() {
		return nil
	}
	ip := net.IP(p.Addr().AsSlice())
	return &net.IPNet{IP: ip, Mask: net.CIDRMask(p.Bits(), 8*len(ip))}
}
