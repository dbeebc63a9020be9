// Package overlay joins a network's bridges across hosts: a VXLAN tunnel
// per network with its flooding list or FRR's EVPN, and WireGuard under
// it when the underlay is not trusted. The network (netplane) wires it and
// guards its tunnel port.
package overlay
