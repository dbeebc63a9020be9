// Package nfqueue reads the packets the kernel's netfilter queues to user
// space (nfnetlink_queue) and gives them their verdicts: accept, drop, or
// repeat with a mark. It is the transport of a verdict taken on a
// connection's first segments in user space, after which the kernel's
// forward path carries the rest (docs/performance.md, "The name check's
// cost"): this machine's kernel queues through xtables' NFQUEUE target
// (nft_compat), not nftables' queue statement.
//
// It speaks the protocol through mdlayher/netlink, as the kernel's
// include/uapi/linux/netfilter/nfnetlink_queue.h lays it out; it is
// Linux's only, and imports nothing of vmnetctl.
package nfqueue
