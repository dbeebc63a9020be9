//go:build !linux

package netplane

import (
	"context"
	"io"
	"net"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/leases"
	"github.com/vmnetctl/vmnetctl/nettypes"
)

// Network is a running network; see the Linux documentation.
type Network struct{}

// Port is a VM's port; see the Linux documentation.
type Port struct{}

// State is what the kernel holds for a network; see the Linux documentation.
type State struct{}

func Start(context.Context, *api.Network, Options) (*Network, error) { return nil, ErrUnsupported }
func Ensure(context.Context, *api.Network) error                     { return ErrUnsupported }
func Remove(context.Context, string, string) error                   { return ErrUnsupported }
func Sweep(context.Context, []string, string) ([]string, error)      { return nil, ErrUnsupported }
func Inspect(context.Context, string) (*State, error)                { return nil, ErrUnsupported }
func Check(context.Context, *api.Network) error                      { return ErrUnsupported }
func PortBridge(*api.Network) (string, error)                        { return "", ErrUnsupported }
func NetworkBridge(*api.Network) (*netlink.Bridge, error)            { return nil, ErrUnsupported }
func CreatePort(*api.Network, PortConfig) (*Port, error)             { return nil, ErrUnsupported }
func DeleteLinkOnEOF(string, io.Reader) error                        { return ErrUnsupported }
func ListSharedInterfaces() ([]string, error)                        { return nil, ErrUnsupported }
func CheckBridgedInterface(*api.Network) error                       { return nil }
func (*Port) CloseFD()                                               {}
func (*Port) Close()                                                 {}
func (*Port) Disown()                                                {}
func (*Port) CleanupFD() int                                         { return -1 }
func (*Port) CleanupPID() int                                        { return 0 }
func (*Port) CleanupDoneFD() int                                     { return -1 }
func CreateMacvtap(*api.Network, string, net.HardwareAddr) (*netlink.Macvtap, error) {
	return nil, ErrUnsupported
}
func AttachPort(string, netlink.Link, bool) error                       { return ErrUnsupported }
func RemoveStaleTap(string) error                                       { return nil }
func (*Network) Close() error                                           { return nil }
func (*Network) Config() *api.Network                                   { return nil }
func (*Network) SetHost(net.HardwareAddr, string, netip.Addr) error     { return ErrUnsupported }
func (*Network) SetPartitions([][2]net.HardwareAddr) error              { return ErrUnsupported }
func (*Network) SetImpairments([]nettypes.PortImpairment) error         { return ErrUnsupported }
func (*Network) SetForwards(context.Context, []nettypes.Forward) error  { return ErrUnsupported }
func (*Network) SetVMEgress(context.Context, []nettypes.VMEgress) error { return ErrUnsupported }
func (*Network) RemoveHost(net.HardwareAddr)                            {}
func (*Network) SetVMs([]string, []net.HardwareAddr)                    {}
func (*Network) ChangeVMs([]string, []string, []net.HardwareAddr)       {}
func (*Network) Leases() []leases.Lease                                 { return nil }
func (*Network) Stats(nettypes.StatsQuery) nettypes.ServiceStats        { return nettypes.ServiceStats{} }
func (*Network) TapCounts([]string) map[string]helperproto.TapCounts    { return nil }

// PortSpec is a running VM port; see the Linux documentation.
type PortSpec struct {
	Name         string
	MAC          net.HardwareAddr
	NoSpoofCheck bool
}

func EnsurePorts(context.Context, *api.Network, []PortSpec) error { return ErrUnsupported }
func WatchChanges(context.Context) (*Watch, error)                { return nil, ErrUnsupported }

func CheckConflicts(*api.Network) error { return ErrUnsupported }
func (*Network) Health() error          { return nil }
func IsNotUp(error) bool                { return false }

func OpenTAP(string) (*os.File, error) { return nil, ErrUnsupported }
func OpenVhostNet() (*os.File, error)  { return nil, ErrUnsupported }
func VhostNet() bool                   { return false }
