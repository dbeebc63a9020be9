package netplane

import (
	"errors"
	"net"
	"os"
	"os/exec"
)

// ErrMacvtapPort: a bridged network whose interface is not a bridge. Its
// VMs get a macvtap on the interface (CreateMacvtap) instead of a TAP on a
// bridge.
var ErrMacvtapPort = errors.New("the VM's port is a macvtap")

// Offloads are what the VM's side of a port does for the host; any of them
// puts a virtio-net header on every frame.
type Offloads struct {
	// Checksum: frames may carry partial checksums.
	Checksum bool
	// TSO: frames may be TCP segments of up to 64 KiB (implies Checksum).
	TSO bool
	// Relayed: offloads the relay does for a VM without them. The port
	// has the virtio-net header, checksum offload and TSO, which the VM
	// has not: the relay merges the VM's TCP segments into the port
	// (relay/coalesce.go) and cuts the host's packets of up to 64 KiB
	// into the VM's frames (relay/gso.go). A TAP's only: a macvtap
	// ignores it.
	Relayed bool
}

// PortConfig says how CreatePort makes a VM's port.
type PortConfig struct {
	// Name is the link's name (api.TapName of the interface id).
	Name string
	// MAC is a macvtap's address; a TAP's is the VM's to choose.
	MAC net.HardwareAddr
	// VMMAC, if set, is the only MAC the guard lets a TAP's VM send from;
	// otherwise the guard keeps the first one the VM uses (GuardPort).
	VMMAC net.HardwareAddr
	// NoSpoofCheck leaves a TAP unguarded: for a VM that bridges machines
	// of its own (containers, nested VMs), whose frames carry their MACs.
	NoSpoofCheck bool
	// UID and GID own a TAP, so that the VM's user may open it; -1 for none.
	UID, GID int
	Offloads Offloads
	// Isolated makes the TAP an isolated bridge port (needs a bridge).
	Isolated bool
	// Persist keeps a TAP when its fd closes, for a VMM that opens it by
	// name (firecracker, cloud-hypervisor, qemu -netdev tap). Needs a bridge.
	Persist bool
	// GuardKept says the caller keeps the network's guard layout (a
	// controller: guard.AddPortKept), so the port's guard does not look
	// at it again.
	GuardKept bool
	// Cleanup returns the command of a child that runs, with the privileges
	// to delete links, DeleteLinkOnEOF(Name, its stdin), or deletes the
	// link of interface index (the port's) on EOF (relay.CleanupCommand).
	// CreatePort calls it for a port that outlives its fd (a macvtap, a
	// persistent TAP) and starts the child with a pipe as stdin, so the
	// port is deleted when the caller returns, exits or is killed, even
	// after dropping privileges. Its stdout and stderr must be files or
	// nil (procid.Start).
	Cleanup func(index uint32) (*exec.Cmd, error)
	// Watch, where set, is used instead of Cleanup: it has a process of
	// the caller's delete the port (interface index) once every copy of
	// keep is closed, and done read EOF then (a controller's link reaper,
	// which deletes every TAP it sets up: relay.Reap).
	Watch func(index uint32) (keep, done *os.File, err error)
}
