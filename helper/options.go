// Package helper is `vmnetctl helper`: the Linux counterpart of vmnet-helper.
// One helper process per VM and network holds the VM's port (a TAP on the
// network's bridge, or a macvtap; the data plane, netplane, makes and
// deletes it) and relays Ethernet frames between it and the VM process over
// a unix datagram socket, one frame per datagram. It is the cable, not a
// switch: the kernel bridge switches.
//
// The contract (flags, the JSON line on stdout, the log and stats lines on
// stderr, SIGTERM) is vmnet-helper's; see docs/helper.md. Main is the
// command; Run, the helper itself, reads as its steps. On macOS vmnetctl
// runs the real vmnet-helper and this package only resolves options.
package helper

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/relay"
)

// Attach modes.
const (
	// AttachRelay relays frames between the TAP and the VM's socket.
	AttachRelay = ""
	// AttachStream relays frames between the TAP and the VMM's connection
	// to the stream socket --socket (qemu -netdev stream, lima's socket:
	// networks): each frame a 4-byte big-endian length and the frame.
	AttachStream = "stream"
	// AttachTap hands a persistent TAP to the VMM (firecracker,
	// cloud-hypervisor, qemu -netdev tap) and relays nothing.
	AttachTap = "tap"
	// AttachVhostUser serves vhost-user on --socket (qemu -netdev
	// vhost-user): the helper maps the guest's memory and moves frames
	// between its rings and the TAP (package vhostuser).
	AttachVhostUser = "vhost-user"
)

// Frame sizes.
const (
	ethHeaderLen = relay.EthHeaderLen
	// MaxJumboMTU is the largest MTU the relay carries.
	MaxJumboMTU = 65520
	// TSOMaxPacketSize is vmnet's max packet size with TSO.
	TSOMaxPacketSize = 65550
	// VirtioNetHdrLen is the virtio-net header (struct virtio_net_hdr_v1)
	// that starts every datagram when offloads are on: the VM port's own.
	VirtioNetHdrLen = helperproto.VirtioNetHdrLen
)

// Options are a helper's settings, as the command line gives them.
type Options struct {
	// FD is an inherited connected SOCK_DGRAM unix socket (--fd), or -1.
	FD int
	// SocketPath is a unix datagram socket to create and serve (--socket).
	SocketPath string
	// Network is the network to join (resolved from --network or
	// --operation-mode).
	Network *api.Network
	// NetworkFlag is set when --network chose it: the JSON line then has
	// the net_* keys, as vmnet-helper's has with --network.
	NetworkFlag bool
	// InterfaceID names the interface; the same id gives the same MAC.
	InterfaceID string
	// TapName is the TAP's name; empty derives one from InterfaceID.
	TapName string
	// Attach is AttachRelay, AttachStream, AttachTap or AttachVhostUser.
	Attach string
	// Isolation makes the TAP an isolated bridge port.
	Isolation bool
	// VMMAC is the only MAC the guard lets the VM send from; nil keeps the
	// first it uses. NoSpoofCheck leaves the port unguarded.
	VMMAC        net.HardwareAddr
	NoSpoofCheck bool
	// NoRelayOffloads: a VM without offloads gets a port without them
	// either: its frames go to the port one by one, never merged, and the
	// host's come cut to the MTU (netplane.Offloads.Relayed).
	NoRelayOffloads bool
	// TSO and ChecksumOffload put a virtio-net header on every datagram.
	TSO, ChecksumOffload bool
	// StatsInterval logs stats lines this often; 0 only at exit.
	StatsInterval time.Duration
	// UID and GID are the VM owner's: the TAP is theirs and the helper runs
	// as them after the privileged steps. -1 keeps the current ids.
	UID, GID int
	// Verbose logs DEBUG lines.
	Verbose bool
	// LogTimestamps starts each log line with its time (relay.Logger).
	LogTimestamps bool
	// StatsFile, if set, keeps the latest stats line (relay.StatsOut);
	// the helper opens it before it drops its privileges.
	StatsFile string
	// ShapingFile, if set, is the link's shaping (helperproto.Shapings),
	// which the controller writes: the helper opens it before it drops
	// its privileges, and the relay reads it at start and at each
	// helperproto.ShapingSignal.
	ShapingFile string
	// Stdout receives the JSON line; Stderr the log.
	Stdout, Stderr io.Writer
}

// Offloads reports whether datagrams carry a virtio-net header.
func (o *Options) Offloads() bool { return o.TSO || o.ChecksumOffload }

// MTU is the network's MTU, capped to what the relay carries.
func (o *Options) MTU() int {
	if o.Network == nil || o.Network.MTU <= 0 {
		return api.DefaultMTU
	}
	return min(o.Network.MTU, MaxJumboMTU)
}

// MaxPacketSize is the largest frame (without virtio-net header) exchanged
// with the VM: MTU+14, or 65550 with TSO.
func (o *Options) MaxPacketSize() int {
	if o.TSO {
		return TSOMaxPacketSize
	}
	return o.MTU() + ethHeaderLen
}

// ModeFlags are vmnet-helper's way of choosing a network without --network.
type ModeFlags struct {
	OperationMode   string
	SharedInterface string
	StartAddress    string
	EndAddress      string
	SubnetMask      string
}

func (m ModeFlags) addressesSet() int {
	n := 0
	for _, s := range []string{m.StartAddress, m.EndAddress, m.SubnetMask} {
		if s != "" {
			n++
		}
	}
	return n
}

// ResolveNetwork finds the network a helper joins: the one named by id, or
// else the one of mode m.OperationMode (for shared and host: the network
// named like the mode, or the only one of that mode). vmnet-helper's address
// flags are accepted only all together and only if they describe the
// network as networks.yaml defines it: the helper cannot change a network.
func ResolveNetwork(nets *api.Networks, id string, m ModeFlags) (*api.Network, error) {
	if id != "" {
		if m.OperationMode != "" || m.SharedInterface != "" || m.addressesSet() > 0 {
			return nil, errors.New("--network excludes --operation-mode, --shared-interface, --start-address, --end-address and --subnet-mask")
		}
		n := nets.Get(id)
		if n == nil {
			return nil, fmt.Errorf("network %q is not defined in %s%s", id, nets.Source, knownNetworks(nets))
		}
		if !n.Managed() {
			return nil, fmt.Errorf("network %q is %s, which vmnetctl does not manage", id, n.Mode)
		}
		return n, nil
	}
	mode := api.Mode(m.OperationMode)
	if mode == "" {
		mode = api.ModeShared // vmnet-helper's default
	}
	switch mode {
	case api.ModeShared, api.ModeHost:
		if m.SharedInterface != "" {
			return nil, fmt.Errorf("--shared-interface is only for --operation-mode bridged")
		}
	case api.ModeBridged:
		if m.SharedInterface == "" {
			return nil, errors.New("--operation-mode bridged requires --shared-interface (see --list-shared-interfaces)")
		}
		if m.addressesSet() > 0 {
			return nil, errors.New("--start-address, --end-address and --subnet-mask are not used with --operation-mode bridged")
		}
	default:
		return nil, fmt.Errorf("unknown --operation-mode %q (shared, host or bridged)", m.OperationMode)
	}
	if mode != api.ModeBridged && m.addressesSet() == 3 {
		if n, err := onDemand(nets, mode, m); n != nil || err != nil {
			return n, err
		}
	}
	var cands []*api.Network
	for _, n := range nets.Networks {
		if n.Mode != mode {
			continue
		}
		if mode == api.ModeBridged && n.Interface != m.SharedInterface {
			continue
		}
		cands = append(cands, n)
	}
	var n *api.Network
	switch {
	case len(cands) == 1:
		n = cands[0]
	case len(cands) > 1 && mode != api.ModeBridged:
		for _, c := range cands {
			if c.ID == string(mode) {
				n = c
			}
		}
		if n == nil {
			ids := make([]string, len(cands))
			for i, c := range cands {
				ids[i] = c.ID
			}
			return nil, fmt.Errorf("%s defines several %s networks (%s): choose one with --network", nets.Source, mode, strings.Join(ids, ", "))
		}
	case mode == api.ModeBridged && len(cands) > 1:
		return nil, fmt.Errorf("%s defines several bridged networks on %s: choose one with --network", nets.Source, m.SharedInterface)
	case mode == api.ModeBridged:
		return nil, fmt.Errorf("%s defines no bridged network on interface %q: add one to networks.yaml", nets.Source, m.SharedInterface)
	default:
		return nil, fmt.Errorf("%s defines no %s network", nets.Source, mode)
	}
	switch m.addressesSet() {
	case 0:
	case 3:
		if err := matchAddresses(n, m); err != nil {
			return nil, err
		}
	default:
		return nil, errors.New("--start-address, --end-address and --subnet-mask must be given together")
	}
	return n, nil
}

// onDemand resolves vmnet-helper's address flags that no network of nets
// has: vmnet makes such a network on demand, and so does vmnetctl
// (api.OnDemandNetwork; the helper brings it up through the controller).
// Flags that match a network of mode give nil, nil: that network is
// joined; flags whose subnet overlaps a network they do not match are an
// error.
func onDemand(nets *api.Networks, mode api.Mode, m ModeFlags) (*api.Network, error) {
	start, end, mask, err := m.addresses()
	if err != nil {
		return nil, err
	}
	n, _, err := api.OnDemandNetwork(mode, start, end, mask)
	if err != nil {
		return nil, err
	}
	for _, x := range nets.Networks {
		if !x.Subnet.IsValid() || !x.Subnet.Overlaps(n.Subnet) {
			continue
		}
		if x.Mode == mode && matchAddresses(x, m) == nil {
			return nil, nil
		}
		return nil, matchAddresses(x, m)
	}
	return n, nil
}

// addresses parses the address flags.
func (m ModeFlags) addresses() (start, end, mask netip.Addr, err error) {
	parse := func(flag, s string) (netip.Addr, error) {
		a, err := netip.ParseAddr(s)
		if err != nil || !a.Is4() {
			return netip.Addr{}, fmt.Errorf("--%s %q is not an IPv4 address", flag, s)
		}
		return a, nil
	}
	start, err1 := parse("start-address", m.StartAddress)
	end, err2 := parse("end-address", m.EndAddress)
	mask, err3 := parse("subnet-mask", m.SubnetMask)
	return start, end, mask, errors.Join(err1, err2, err3)
}

func matchAddresses(n *api.Network, m ModeFlags) error {
	start, end, mask, err := m.addresses()
	if err != nil {
		return err
	}
	want := api.SubnetMask(n.Subnet)
	if start != n.Gateway || end != n.DHCPEnd || mask != want {
		return fmt.Errorf("--start-address %s --end-address %s --subnet-mask %s do not match network %q (%s to %s, mask %s, defined at %s): the helper joins networks as networks.yaml defines them",
			start, end, mask, n.ID, n.Gateway, n.DHCPEnd, want, n.Source)
	}
	return nil
}

func knownNetworks(nets *api.Networks) string {
	var ids []string
	for _, n := range nets.Networks {
		if n.Managed() {
			ids = append(ids, n.ID)
		}
	}
	if len(ids) == 0 {
		return ""
	}
	slices.Sort(ids)
	return " (defined: " + strings.Join(ids, ", ") + ")"
}
