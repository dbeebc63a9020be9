package netplane

import (
	"context"
	"fmt"
	"net"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/vmnetctl/vmnetctl/api"
)

// PortSpec is what a running VM port of a network should be: a TAP on the
// network's bridge, guarded unless NoSpoofCheck, with MAC pinned (nil: the
// MAC the guard learned, or learns).
type PortSpec struct {
	Name         string
	MAC          net.HardwareAddr
	NoSpoofCheck bool
}

// EnsurePorts puts back what was taken from network n's running ports
// behind their helpers' backs: a TAP that left the bridge (the bridge was
// deleted and made again) joins it again, and a guarded port whose guard
// is gone (the guard table was deleted) is guarded again before that. A
// port that no longer exists is left to its helper, which ends and is
// restarted. The guard of a port that still has one is kept, with the MAC
// it learned. Bridged networks' macvtaps need nothing.
func EnsurePorts(ctx context.Context, n *api.Network, ports []PortSpec) error {
	if !n.Routed() || len(ports) == 0 {
		return nil
	}
	br, err := NetworkBridge(n)
	if err != nil {
		return err
	}
	guarded, err := guardedPorts(ctx, n.ID)
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range ports {
		link, err := netlink.LinkByName(p.Name)
		if err != nil {
			continue // gone: its helper ends
		}
		if !p.NoSpoofCheck && !guarded[p.Name] {
			if err := GuardPort(ctx, n, p.Name, p.MAC); err != nil {
				errs = append(errs, err)
				continue // not onto the bridge unguarded
			}
		}
		if link.Attrs().MasterIndex != br.Attrs().Index {
			if err := AttachPort(br.Attrs().Name, link, n.Isolation); err != nil {
				errs = append(errs, fmt.Errorf("network %q: %w", n.ID, err))
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%v", errs)
	}
	return nil
}

// guardedPorts returns the ports network id's guard map holds.
func guardedPorts(ctx context.Context, id string) (map[string]bool, error) {
	nft, err := newNFT(knftables.BridgeFamily, id)
	if err != nil {
		return nil, err
	}
	elems, err := nft.ListElements(ctx, "map", guardPorts)
	if err != nil && !knftables.IsNotFound(err) {
		return nil, fmt.Errorf("network %q: reading the guarded ports: %w", id, err)
	}
	out := map[string]bool{}
	for _, e := range elems {
		if len(e.Key) == 1 {
			out[strings.Trim(e.Key[0], `"`)] = true
		}
	}
	return out, nil
}

// WatchLinks reports, on the returned channel, changes to vmnetctl's links
// that the controller should look at: a bridge or a VM's TAP deleted, a TAP
// that left its bridge, a bridge set down. Sends do not block: a change
// that comes while one is pending is folded into it. The watch ends with
// ctx.
func WatchLinks(ctx context.Context) (<-chan struct{}, error) {
	updates := make(chan netlink.LinkUpdate, 64)
	if err := netlink.LinkSubscribeWithOptions(updates, ctx.Done(), netlink.LinkSubscribeOptions{
		ErrorCallback: func(error) {},
	}); err != nil {
		return nil, fmt.Errorf("watching links: %w", err)
	}
	out := make(chan struct{}, 1)
	go func() {
		for u := range updates {
			if linkChanged(u) {
				select {
				case out <- struct{}{}:
				default:
				}
			}
		}
	}()
	return out, nil
}

func linkChanged(u netlink.LinkUpdate) bool {
	a := u.Link.Attrs()
	bridge, tap := strings.HasPrefix(a.Name, api.BridgePrefix), strings.HasPrefix(a.Name, api.TapPrefix)
	switch {
	case !bridge && !tap:
		return false
	case u.Header.Type == unix.RTM_DELLINK:
		return true
	case tap:
		return a.MasterIndex == 0
	default:
		return a.Flags&net.FlagUp == 0
	}
}
