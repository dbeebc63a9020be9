package netplane

import (
	"fmt"

	"github.com/vishvananda/netlink"
)

// AttachPort makes link a port of the network bridge named bridge: same MTU
// as the bridge, isolated (no traffic to other isolated ports) when asked,
// and up. It is idempotent. The helper calls it for each VM's TAP.
func AttachPort(bridge string, link netlink.Link, isolated bool) error {
	br, err := netlink.LinkByName(bridge)
	if err != nil {
		return fmt.Errorf("network bridge %s: %w", bridge, err)
	}
	if _, ok := br.(*netlink.Bridge); !ok {
		return fmt.Errorf("%s is a %s, not a bridge", bridge, br.Type())
	}
	name := link.Attrs().Name
	if link.Attrs().MTU != br.Attrs().MTU {
		if err := netlink.LinkSetMTU(link, br.Attrs().MTU); err != nil {
			return fmt.Errorf("setting MTU of %s: %w", name, err)
		}
	}
	if link.Attrs().MasterIndex != br.Attrs().Index {
		if err := netlink.LinkSetMaster(link, br); err != nil {
			return fmt.Errorf("adding %s to bridge %s: %w", name, bridge, err)
		}
	}
	if err := netlink.LinkSetIsolated(link, isolated); err != nil {
		return fmt.Errorf("setting isolation of %s: %w", name, err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("setting %s up: %w", name, err)
	}
	return nil
}

// RemoveStaleTap deletes the TAP named name if a helper left it behind: it
// must carry TapMark(name). A link of that name without the mark is not
// vmnetctl's and is left alone. A missing link is fine.
func RemoveStaleTap(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		if notFound(err) {
			return nil
		}
		return fmt.Errorf("TAP %s: %w", name, err)
	}
	if l.Attrs().Alias != TapMark(name) {
		return nil
	}
	if err := netlink.LinkDel(l); err != nil && !notFound(err) {
		return fmt.Errorf("deleting stale TAP %s: %w", name, err)
	}
	return nil
}
