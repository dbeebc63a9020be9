// Package linuxnet is the Linux backend: vmnetctl's own data plane
// (netplane: bridges, nftables, DHCP, DNS) and its own helper
// (`vmnetctl helper`, one per attachment).
package linuxnet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/backend"
	"github.com/vmnetctl/vmnetctl/capture"
	"github.com/vmnetctl/vmnetctl/guard"
	"github.com/vmnetctl/vmnetctl/helper"
	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/leases"
	"github.com/vmnetctl/vmnetctl/netplane"
	"github.com/vmnetctl/vmnetctl/overlay"
	"github.com/vmnetctl/vmnetctl/shaper"
)

// Backend is vmnetctl's own data plane and helper.
type Backend struct{}

// Name is the backend's name for --backend.
const Name = "vmnetctl"

func (Backend) Name() string { return Name }

func (Backend) StartNetwork(ctx context.Context, n *api.Network, o backend.NetworkOptions) (backend.Network, error) {
	hostnet.SetOwner(o.Owner)
	nw, err := netplane.Start(ctx, n, netplane.Options{StateDir: o.LeaseDir, Upstreams: o.Upstreams, Log: o.Log, OnLease: o.OnLease,
		OnEgressDenied: o.OnEgressDenied})
	if err != nil {
		return nil, err
	}
	return nw, nil
}

func (Backend) RemoveNetwork(ctx context.Context, id string, o backend.NetworkOptions) error {
	hostnet.SetOwner(o.Owner)
	return netplane.Remove(ctx, id, o.LeaseDir)
}

func (Backend) Sweep(ctx context.Context, keep []string, o backend.NetworkOptions) ([]string, error) {
	hostnet.SetOwner(o.Owner)
	removed, err := netplane.Sweep(ctx, keep, o.LeaseDir)
	return removed, errors.Join(err, shaper.SweepStrays())
}

func (Backend) CheckNetwork(ctx context.Context, n *api.Network, o backend.NetworkOptions) error {
	hostnet.SetOwner(o.Owner)
	return netplane.Check(ctx, n)
}

func (Backend) EnsurePorts(ctx context.Context, n *api.Network, ports []backend.Port) error {
	specs := make([]netplane.PortSpec, len(ports))
	for i, p := range ports {
		specs[i] = netplane.PortSpec{Name: p.Name, MAC: p.MAC, NoSpoofCheck: !p.SpoofCheck}
	}
	return netplane.EnsurePorts(ctx, n, specs)
}

var _ backend.Partitioner = (*netplane.Network)(nil)
var _ backend.TapCounter = (*netplane.Network)(nil)

// Capture copies port's frames to w as pcapng (package capture).
func (Backend) Capture(ctx context.Context, port string, o backend.CaptureOptions, w io.Writer) (backend.CaptureStats, error) {
	return capture.Port(ctx, port, o, w)
}

// SetBandwidth limits port's bandwidth (package shaper).
func (Backend) SetBandwidth(_ context.Context, port string, b *api.Bandwidth) error {
	return shaper.Set(port, b)
}

// ClaimPorts claims each attachment's MAC for its helper's TAP in n's
// guard (guard.ClaimPorts).
func (Backend) ClaimPorts(ctx context.Context, n *api.Network, atts []*api.Attachment, o backend.ClaimOptions) error {
	if ch := o.Changed; ch != nil {
		// The changed attachments' ports alone, where the guard can tell
		// from its last claims: a VM's attach costs the same at any size.
		expect := map[string]net.HardwareAddr{}
		var drop []string
		for _, a := range ch.Added {
			if mac, err := net.ParseMAC(a.MAC); err == nil {
				expect[TapName(a)] = mac
			} else {
				drop = append(drop, TapName(a))
			}
		}
		for _, a := range ch.Removed {
			drop = append(drop, TapName(a))
		}
		if handled, err := guard.ClaimPortsChanged(ctx, n, expect, drop, o); handled {
			return err
		}
	}
	expected := map[string]net.HardwareAddr{}
	for _, a := range atts {
		if mac, err := net.ParseMAC(a.MAC); err == nil {
			expected[TapName(a)] = mac
		}
	}
	return guard.ClaimPorts(ctx, n, expected, o)
}

// StoredLeases reads n's lease file under o.LeaseDir (netplane.LeaseFile).
func (Backend) StoredLeases(n *api.Network, o backend.NetworkOptions) ([]backend.Lease, error) {
	return leases.Read(netplane.LeaseFile(o.LeaseDir, n.ID), time.Now())
}

// Changes reports vmnetctl's bridges, TAPs, bridge addresses and nftables
// tables deleted or changed, and services stopped (netplane.WatchChanges).
func (Backend) Changes(ctx context.Context) (<-chan struct{}, func() (uint64, bool), error) {
	w, err := netplane.WatchChanges(ctx)
	if err != nil {
		return nil, nil, err
	}
	return w.C, w.Notices, nil
}

// Limits: the Linux data plane honours every setting of networks.yaml;
// it warns of a bridged network whose host interface is missing here (on
// Linux), with the interfaces it could bridge onto, before up fails on it.
func (b Backend) Limits(nets []*api.Network, _ []*api.Attachment) []backend.Limit {
	var out []backend.Limit
	for _, n := range nets {
		if n.Mode != api.ModeBridged {
			continue
		}
		if err := netplane.CheckBridgedInterface(n); err != nil {
			out = append(out, backend.Limit{Message: fmt.Sprintf("network %s (%s): up would fail: %v", n.ID, b.Name(), err)})
		}
	}
	return out
}

// Cleanup removes the TAP of a helper that was killed with its cleanup
// child (only if it carries the mark of this state dir's helper:
// netplane.RemoveStaleTap), and the IFB device that shaped what its VM
// sent (shaper.Remove; the controller sets it again for a new helper).
func (Backend) Cleanup(a *api.Attachment) error {
	return errors.Join(netplane.RemoveStaleTap(TapName(a)), shaper.Remove(TapName(a)))
}

// TapName is the TAP of attachment a's helper.
func TapName(a *api.Attachment) string {
	return api.AttachmentTapName(a.VM, a.Index, a.MAC)
}

// HelperEnv says the helper runs under the controller (EnvUnderController):
// its network is the controller's to keep up, not the helper's to hold. It
// takes the VM's owner as --uid and --gid, not sudo's variables (under
// those it would refuse what only root may ask for, such as
// --no-spoof-check). It names the state dir (hostnet.EnvOwner), so that
// the VM port the helper makes carries that state dir's mark.
func (Backend) HelperEnv(s backend.HelperSpec) []string {
	env := []string{helperproto.EnvUnderController + "=1"}
	if s.Owner != "" {
		env = append(env, hostnet.OwnerEnv(s.Owner))
	}
	return env
}

// Shapes says whether a's helper shapes its link (backend.LinkShaper): every
// helper but a TAP's, whose frames go between the VMM and the kernel.
func (Backend) Shapes(a *api.Attachment) bool { return a.Attach != api.AttachTAP }

// HelperProgram runs `vmnetctl helper` as vmnetctl-helper, when it can
// (backend.HelperProgrammer, helper.Program).
func (Backend) HelperProgram(argv0 string) string { return helper.Program(argv0) }

// PrepareHelper sets up a helper in the controller's process and gives
// the command that starts only its relay (backend.HelperPreparer,
// helper.Prepare).
func (Backend) PrepareHelper(argv []string, s backend.HelperSpec) (*backend.PreparedHelper, error) {
	p, err := helper.Prepare(argv, s.Network)
	if p == nil || err != nil {
		return nil, err
	}
	return &backend.PreparedHelper{Cmd: p.Cmd, Log: p.Log, Release: p.Release, AfterExit: p.AfterExit()}, nil
}

// HelperCommand is `vmnetctl helper` for one attachment.
func (Backend) HelperCommand(s backend.HelperSpec) ([]string, error) {
	a, n := s.Attachment, s.Network
	args := []string{s.Executable, "helper", "--networks", s.NetworksFile, "--network", n.ID,
		"--interface-id", api.InterfaceID(a.VM, a.Index, a.MAC), "--tap", TapName(a),
		"--stats-interval", strconv.FormatFloat(s.StatsInterval.Seconds(), 'f', -1, 64), "--log-timestamps"}
	if s.StatsFile != "" {
		args = append(args, "--stats-file", s.StatsFile)
	}
	if s.ShapingFile != "" && (Backend{}).Shapes(a) {
		args = append(args, "--shaping-file", s.ShapingFile)
	}
	if s.UID >= 0 {
		args = append(args, "--uid", strconv.Itoa(s.UID), "--gid", strconv.Itoa(s.GID))
	}
	if n.Isolation {
		args = append(args, "--enable-isolation")
	}
	if mac := a.PinnedMAC(); mac != "" {
		args = append(args, "--mac", mac)
	}
	if !a.SpoofCheck() {
		args = append(args, "--no-spoof-check")
	}
	if n.Offloads && a.Attach != api.AttachStream && a.Attach != api.AttachVhostUser {
		// (A stream's frames carry no virtio-net header; vhost-user
		// negotiates virtio's features with the VMM.)
		args = append(args, "--enable-tso", "--enable-checksum-offload")
	}
	switch {
	case a.Attach == api.AttachVhostUser && s.FD >= 0:
		return nil, errors.New("attach: vhost-user: the VMM connects to the helper's socket; `vmnetctl run` hands over no vhost-user descriptor (use `up` and `vmnetctl args`)")
	case a.Attach == api.AttachVhostUser:
		args = append(args, "--attach", "vhost-user", "--socket", s.Socket)
	case s.FD >= 0 && a.Attach == api.AttachStream:
		args = append(args, "--attach", "stream", "--fd", strconv.Itoa(s.FD))
	case s.FD >= 0:
		args = append(args, "--fd", strconv.Itoa(s.FD))
	case a.Attach == api.AttachTAP:
		args = append(args, "--attach", "tap")
	case a.Attach == api.AttachStream:
		args = append(args, "--attach", "stream", "--socket", s.Socket)
	default:
		args = append(args, "--socket", s.Socket)
	}
	return args, nil
}

// EnsureFRR gives FRR network n's EVPN configuration again, if it lacks
// it (overlay.EnsureFRR).
func (Backend) EnsureFRR(ctx context.Context, n *api.Network, o backend.NetworkOptions) error {
	hostnet.SetOwner(o.Owner)
	return overlay.EnsureFRR(ctx, n)
}
