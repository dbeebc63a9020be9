// Package vhostuser is a vhost-user-net backend (issue 35): the VMM (qemu
// `-netdev vhost-user`, cloud-hypervisor `--net vhost_user=true`) shares
// the guest's memory and hands over the virtqueues of its virtio-net
// device, and the backend moves frames between the guest's rings and a
// port (a TAP) itself: readv and writev straight from and to guest
// memory, one copy, the kernel's, where a socket path copies four times.
//
// The protocol is qemu's docs/interop/vhost-user.rst: messages on a unix
// stream socket (a 12-byte header, a payload, descriptors passed with
// SCM_RIGHTS), the backend the server. What this backend offers:
//
//   - virtio 1.0 (VIRTIO_F_VERSION_1: the 12-byte virtio-net header) and
//     vhost-user's protocol features (REPLY_ACK); one queue pair (RX 0,
//     TX 1); split rings, without indirect descriptors or event indices;
//   - with a port that takes virtio-net headers (Config.VnetHdr),
//     checksum offload and TSO both ways: the guest's headers are
//     checked and passed through, and the port hands the guest what it
//     negotiated (Config.SetOffloads); for a guest without TSO the
//     backend merges runs of its TCP segments into one packet for the
//     port (relay.Coalescer) and cuts the port's 64 KiB packets into its
//     frames (relay.Segmenter), so that the port is read and written once
//     per 64 KiB rather than once per frame;
//   - a shaped link (Config.Shaped, Backend.Shape): the relay's delay
//     lines (relay.DelayLine) delay, duplicate and reorder the frames
//     both ways, as a VM file's impair says, those let go to the guest
//     waiting (bounded) for its RX buffers;
//   - a memory table of up to 8 regions, each mapped from the descriptor
//     the VMM sends, and every guest address translated with bounds
//     checks: a descriptor outside the shared memory, a chain that loops
//     or runs past the ring, a ring that does not fit, are refused with a
//     log line, and the session ends (its socket closed: the VMM sees its
//     backend go), never a read or write outside the memory;
//   - kick and call eventfds (and a ring without a call fd: no interrupt);
//   - a VMM that goes (its socket closes, or dies mid-message) ends the
//     session: its memory is unmapped and the backend waits for the next
//     VMM on the same socket (a restarted VMM reconnects).
//
// The rings' shared indices are read and written with sync/atomic where
// the spec orders them (the used index after its entries; the guest's
// flags read after the used index is published).
package vhostuser
