// Package arplearn binds the IPv4 addresses VMs give themselves, heard in
// the ARP packets a network's guard copies to it, when the lease store
// lets them.
package arplearn
