// Package netplane is vmnetctl's Linux data plane: the bridge, addresses,
// nftables rules, DHCP server and DNS proxy of each network, and the ports
// (TAP or macvtap) that VMs are attached through. Everything it creates is
// marked as vmnetctl's, and it never touches what it did not create.
package netplane
