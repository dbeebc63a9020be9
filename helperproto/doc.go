// Package helperproto is the helper's contract with whoever runs it, as
// vmnet-helper defines it: the one JSON line a helper prints on stdout once
// the VM's interface is ready (Ready, ParseReady) and the stats lines it logs
// on stderr (Stats, ParseStatsLine, FormatStatsLine). `vmnetctl helper`
// writes them, helperexec and the controller read them, and the fake
// vmnet-helper of the tests writes them too; docs/helper.md describes them.
package helperproto

// EnvUnderController is set in the environment of the helpers the
// controller (or `vmnetctl run`) starts: their networks are the
// controller's to keep up.
const EnvUnderController = "VMNETCTL_UNDER_CONTROLLER"

// VirtioNetHdrLen is the virtio-net header (struct virtio_net_hdr_v1) that
// starts every datagram of a VM with offloads (vmnet-helper's contract
// with its VMM), and every frame of a VM port with them on (the TAP's
// TUNSETVNETHDRSZ).
const VirtioNetHdrLen = 12

// SocketLock is the lock file beside a helper's --socket path: the helper
// holds a flock on it while it serves, so a second helper on the same path
// refuses; one that is killed leaves both behind, for the next to replace
// or the controller to remove.
func SocketLock(socket string) string { return socket + ".lock" }
