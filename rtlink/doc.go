// Package rtlink asks the kernel's rtnetlink about one link by its
// interface index: whether it is there, its counters and flags, its
// addresses, its deletion, and hears of that deletion alone. It is the
// part of rtnetlink that vmnetctl-relay needs to hold a persistent TAP
// for a VMM (relay.Hold) and to delete it once its holder is gone, in
// golang.org/x/sys/unix only: a relay is one process a VM, and the
// netlink libraries the rest of vmnetctl uses (vishvananda/netlink,
// mdlayher/netlink) would each add to every relay's size and start.
// The rest of vmnetctl reads a link's addresses through it too
// (hostnet.AddrsOf): netlink.AddrList dumps every address of the host.
package rtlink
