package doctor

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/netplane"
)

// checkWireGuard: a network across hosts whose underlay is encrypted needs
// its WireGuard port free on this host, unless its own device (running)
// holds it; the finding says this host's tunnel address.
func checkWireGuard(_ context.Context, nets []*api.Network) []Finding {
	var out []Finding
	for _, n := range nets {
		if n.VXLAN == nil || n.VXLAN.WireGuard == nil {
			continue
		}
		i, _, err := netplane.VXLANHost(n)
		if err != nil {
			continue // checkVXLAN says so
		}
		name, port := "WireGuard of "+n.ID, int(n.VXLAN.WireGuard.Port)
		f := Finding{Check: name, Status: OK, Detail: fmt.Sprintf("this host's tunnel address is %s; UDP port %d", n.VXLAN.TunnelAddr(i), port)}
		if _, err := netlink.LinkByName(api.WireGuardName(n.ID)); err == nil {
			f.Detail += " is its device's (" + api.WireGuardName(n.ID) + " runs)"
		} else if c, err := net.ListenUDP("udp", &net.UDPAddr{Port: port}); errors.Is(err, unix.EADDRINUSE) {
			f.Status, f.Detail = Fail, fmt.Sprintf("UDP port %d, WireGuard's for network %s, is taken by another program", port, n.ID)
			f.Fix = fmt.Sprintf("find it (ss -ulpn 'sport = :%d') and stop it, or set networks.%s.vxlan.wireguard.port to a port free on every host", port, n.ID)
		} else if err == nil {
			c.Close()
			f.Detail += " is free"
		}
		out = append(out, f)
	}
	return out
}
