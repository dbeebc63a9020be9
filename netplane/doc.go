// Package netplane is vmnetctl's Linux network: each network's bridge,
// addresses and nftables tables, the ports (TAP or macvtap) VMs are
// attached through, and the wiring of the services it composes (the lease
// store, DHCP, the DNS proxy, router advertisements, the address learners,
// the guard, the overlay), which never import it. Everything it creates is
// marked as vmnetctl's, and it never touches what it did not create.
package netplane
