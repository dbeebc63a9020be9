package doctor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/overlay"
)

// checkWireGuard: a network across hosts whose underlay is encrypted needs
// its WireGuard port free on this host, unless its own device (running)
// holds it; the finding says this host's tunnel address. A device whose
// port nobody holds, or another program does (the controller made the
// device and could not listen), is a failure too.
func checkWireGuard(_ context.Context, nets []*api.Network) []Finding {
	var out []Finding
	for _, n := range nets {
		if n.VXLAN == nil || n.VXLAN.WireGuard == nil {
			continue
		}
		i, _, err := overlay.VXLANHost(n)
		if err != nil {
			continue // checkVXLAN says so
		}
		name, port, dev := "WireGuard of "+n.ID, int(n.VXLAN.WireGuard.Port), api.WireGuardName(n.ID)
		f := Finding{Check: name, Status: OK, Detail: fmt.Sprintf("this host's tunnel address is %s; UDP port %d", n.VXLAN.TunnelAddr(i), port)}
		taken := Finding{Check: name, Status: Fail, Detail: fmt.Sprintf("UDP port %d, WireGuard's for network %s, is taken by another program", port, n.ID),
			Fix: fmt.Sprintf("find it (ss -ulpn 'sport = :%d') and stop it, or set networks.%s.vxlan.wireguard.port to a port free on every host", port, n.ID)}
		if l, err := netlink.LinkByName(dev); err == nil {
			switch holders := udpPortHolders(port); {
			case l.Type() == "wireguard": // the kernel's: its socket is no process's
				f.Detail += " is its device's (" + dev + " runs)"
			case len(holders) == 0:
				f.Status, f.Detail = Fail, fmt.Sprintf("%s exists and nothing listens on its UDP port %d: the segment is cut", dev, port)
				f.Fix = "see the controller's log (vmnetctl logs) for why it could not take the port; vmnetctl up again once it is free"
			case slices.ContainsFunc(holders, func(pid int) bool { return holdsTUN(pid, dev) }):
				f.Detail += " is its device's (" + dev + " runs)"
			default:
				f = taken
				f.Detail += fmt.Sprintf(" (pid %d), and %s does not listen", holders[0], dev)
			}
		} else if c, err := net.ListenUDP("udp", &net.UDPAddr{Port: port}); errors.Is(err, unix.EADDRINUSE) {
			f = taken
		} else if err == nil {
			c.Close()
			f.Detail += " is free"
		}
		out = append(out, f)
	}
	return out
}

// udpPortHolders are the processes with a UDP socket bound to port, IPv4 or
// IPv6, in the calling thread's network namespace (listeners and
// socketOwners, as checkPorts reads them).
func udpPortHolders(port int) []int {
	var pids []int
	var owners map[string][]socketOwner
	for _, l := range listeners(port) {
		if l.proto != "udp" || l.inode == "0" {
			continue
		}
		if owners == nil {
			owners = socketOwners()
		}
		for _, o := range owners[l.inode] {
			if !slices.Contains(pids, o.pid) {
				pids = append(pids, o.pid)
			}
		}
	}
	return pids
}

// holdsTUN reports whether process pid has the TUN device name open (its
// file's fdinfo names the interface).
func holdsTUN(pid int, name string) bool {
	dir := fmt.Sprintf("/proc/%d/fdinfo", pid)
	fds, _ := os.ReadDir(dir)
	for _, fd := range fds {
		b, err := os.ReadFile(filepath.Join(dir, fd.Name()))
		if err == nil && strings.Contains(string(b), "\niff:\t"+name+"\n") {
			return true
		}
	}
	return false
}
