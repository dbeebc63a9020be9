//go:build !linux

package guard

import (
	"context"
	"errors"
	"net"
	"net/netip"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/nettypes"
)

// The guard is Linux's: on other systems vmnet (through vmnet-helper) is
// the data plane.

func AddPort(context.Context, *api.Network, string, net.HardwareAddr) error {
	return errors.ErrUnsupported
}
func AddPortKept(context.Context, *api.Network, string, net.HardwareAddr) error {
	return errors.ErrUnsupported
}
func RemovePort(context.Context, *api.Network, string) error { return errors.ErrUnsupported }
func ClaimPorts(context.Context, *api.Network, map[string]net.HardwareAddr, nettypes.ClaimOptions) error {
	return errors.ErrUnsupported
}
func ClaimPortsChanged(context.Context, *api.Network, map[string]net.HardwareAddr, []string, nettypes.ClaimOptions) (bool, error) {
	return true, errors.ErrUnsupported
}
func BindAddress(context.Context, *api.Network, net.HardwareAddr, netip.Addr) error {
	return errors.ErrUnsupported
}
func SetPartitionPairs(context.Context, *api.Network, [][2]net.HardwareAddr) error {
	return errors.ErrUnsupported
}

func SetImpairments(context.Context, *api.Network, []nettypes.PortImpairment) error {
	return errors.ErrUnsupported
}
