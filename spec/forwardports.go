package spec

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
)

// CheckForwardPorts refuses the port forwards of project whose host port
// a program of the host listens on: the forward would take its
// connections (DNAT comes first), which nobody asked for. A port that
// only vmnetctl forwards is free: DNAT binds nothing.
func CheckForwardPorts(desired *Desired, project string) error {
	var errs []error
	for _, a := range desired.Attachments {
		if a.Project != project {
			continue
		}
		for _, pf := range a.PortForwards {
			for port := pf.HostPort.First; port <= pf.HostPort.Last; port++ {
				if err := portFree(pf.Proto, pf.HostIP, port); err != nil {
					errs = append(errs, fmt.Errorf("%s: VM %s forwards host port %d/%s, which is in use on the host (%v): stop what listens there, or forward another port",
						pf.Source, a.VM, port, pf.Proto, err))
					break
				}
			}
		}
	}
	return errors.Join(errs...)
}

// portFree reports whether nothing listens on ip:port (every address when
// ip is 0.0.0.0): it binds the port for a moment.
func portFree(proto string, ip netip.Addr, port int) error {
	addr := net.JoinHostPort(ip.String(), fmt.Sprint(port))
	var err error
	if proto == "udp" {
		var c net.PacketConn
		if c, err = net.ListenPacket("udp4", addr); err == nil {
			return c.Close()
		}
	} else {
		var l net.Listener
		if l, err = net.Listen("tcp4", addr); err == nil {
			return l.Close()
		}
	}
	if errors.Is(err, syscall.EADDRINUSE) {
		return errors.New("address in use")
	}
	return nil // not ours to judge (an address the host does not have yet, say)
}
