// Package relay is the helper's data path once the VM's port and socket
// exist: it moves frames between a TAP and the VM's unix datagram socket,
// follows a restarted VMM, and logs the counters. It imports nothing of
// vmnetctl's but helperproto, so that the small vmnetctl-relay binary,
// which a helper execs into once it is set up, stays small: an idle helper
// then holds no YAML, DHCP, DNS, nftables or Prometheus code in its memory
// (docs/performance.md).
package relay

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/vmnetctl/vmnetctl/helperproto"
)

// EnvSpec is the variable that hands vmnetctl-relay its Spec, as JSON.
const EnvSpec = helperproto.EnvRelaySpec

// IdleEnv is in the environment vmnetctl-relay is started with: one P
// (GOMAXPROCS) while it waits for its VM, which most of a fleet's relays
// do for most of an `up`; Serve gives it more when the VM comes
// (servingProcs).
const IdleEnv = "GOMAXPROCS=1"

// Binary is the small relay executable's name; it is installed next to
// vmnetctl.
const Binary = "vmnetctl-relay"

// EnvDeleteLink, in vmnetctl-relay's environment, makes it a TAP's
// cleanup child (DeleteLinkOnEOF) of the interface index it holds.
const EnvDeleteLink = "VMNETCTL_RELAY_DELETE_LINK"

// EnvDeleteMark, with EnvDeleteLink, is the mark the TAP carries.
const EnvDeleteMark = "VMNETCTL_RELAY_DELETE_MARK"

// CleanupArg is a cleanup child's first argument, before the TAP's name:
// what ps shows of it.
const CleanupArg = "delete-link-on-eof"

// EthHeaderLen is an Ethernet header's length.
const EthHeaderLen = 14

// SpecVersion changes whenever Spec's meaning does: vmnetctl-relay refuses
// a spec of another version (a vmnetctl and a vmnetctl-relay of different
// builds), before it prints the ready line.
const SpecVersion = 5

// Spec is what the relay serves: descriptors the helper opened, and the
// helper's options that still matter once frames flow.
type Spec struct {
	Version int `json:"version"`
	// TAP is the VM port's descriptor (non-blocking), TapName its name.
	TAP     int    `json:"tap"`
	TapName string `json:"tapName"`
	// Socket is the VM's socket: the inherited --fd, or the --socket
	// listener, whose path is SocketPath and whose lock file LockFD holds.
	Socket     int    `json:"socket"`
	SocketPath string `json:"socketPath,omitempty"`
	LockFD     int    `json:"lockFD,omitempty"`
	// Stream: SocketPath is a stream socket, each frame a 4-byte
	// big-endian length and the frame (qemu's -netdev stream,
	// socket_vmnet's), served one VMM at a time (stream_linux.go).
	Stream bool `json:"stream,omitempty"`
	// Hdr is the virtio-net header's length (0 without offloads); Frame a
	// buffer's size: Hdr and the largest packet.
	Hdr   int `json:"hdr"`
	Frame int `json:"frame"`
	// TapHdr is the virtio-net header's length on a TAP with checksum
	// offload and TSO when the VM's frames have neither (Hdr 0): the relay
	// merges the VM's TCP segments (coalesce.go) and cuts the host's
	// packets into the VM's frames (gso.go). 0: the TAP's frames are the
	// VM's.
	TapHdr int `json:"tapHdr,omitempty"`
	// StatsInterval is how often the counters are logged; 0: only at the
	// end, and only if asked for.
	StatsInterval time.Duration `json:"statsInterval"`
	Verbose       bool          `json:"verbose"`
	// StatsFD, if not 0, is the stats file (StatsOut) the relay keeps
	// its latest stats line in.
	StatsFD int `json:"statsFD,omitempty"`
	// LogTimestamps starts each log line with its time (Logger).
	LogTimestamps bool `json:"logTimestamps,omitempty"`
	// Relearn, for a port whose guard learns the VM's MAC, is the command
	// that makes it forget the learned MAC; it runs when a restarted VMM is
	// served, which may use another. Empty: the port does not learn.
	Relearn []string `json:"relearn,omitempty"`
	// Keep are descriptors the relay only holds until it ends: the port's
	// end of the pipe to its cleanup child (a macvtap's), which deletes the
	// port once the relay, the last holder, is gone.
	Keep []int `json:"keep,omitempty"`
	// CleanupPID is that cleanup child (still the process's child after
	// the exec): the relay closes Keep and waits for it when it stops, so
	// the port is gone before the relay is, as with the helper itself.
	CleanupPID int `json:"cleanupPID,omitempty"`
	// CleanupDone, where the cleanup child is another's (the
	// controller's: CleanupPID 0), is the read end of a pipe only that
	// child writes to (netplane.Port.CleanupDoneFD): the relay waits for
	// its EOF, the child's exit, when it stops.
	CleanupDone int `json:"cleanupDone,omitempty"`
	// ShapingFD, if not 0, is the helper's shaping file
	// (helperproto.Shapings), open: read when the relay starts and at
	// each helperproto.ShapingSignal.
	ShapingFD int `json:"shapingFD,omitempty"`
	// Ready is the helper's ready line, for vmnetctl-relay to print once
	// it catches SIGTERM.
	Ready string `json:"ready,omitempty"`
	// Hold: the relay moves no frames; it holds a persistent TAP, which
	// the VMM opens by name (`attach: tap`), of interface index TapIndex
	// (Hold). TAP and Socket are -1 then.
	Hold     bool `json:"hold,omitempty"`
	TapIndex int  `json:"tapIndex,omitempty"`
}

// Encode is s for EnvSpec.
func (s Spec) Encode() (string, error) {
	s.Version = SpecVersion
	b, err := json.Marshal(s)
	return string(b), err
}

// DecodeSpec reads what Encode wrote.
func DecodeSpec(v string) (Spec, error) {
	var s Spec
	if err := json.Unmarshal([]byte(v), &s); err != nil {
		return Spec{}, fmt.Errorf("%s: %w", EnvSpec, err)
	}
	if s.Version != SpecVersion {
		return Spec{}, fmt.Errorf("%s: version %d, and this %s reads version %d: install vmnetctl and %s of one build", EnvSpec, s.Version, Binary, SpecVersion, Binary)
	}
	if s.Hold {
		if s.TapIndex <= 0 {
			return Spec{}, fmt.Errorf("%s: incomplete: %s", EnvSpec, v)
		}
		return s, nil
	}
	if s.TAP < 0 || s.Socket < 0 || s.Frame <= s.Hdr || s.TapHdr != 0 && (s.TapHdr != helperproto.VirtioNetHdrLen || s.Hdr != 0) {
		return Spec{}, fmt.Errorf("%s: incomplete: %s", EnvSpec, v)
	}
	return s, nil
}
