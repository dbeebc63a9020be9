package overlay

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/nettypes"
	"github.com/vmnetctl/vmnetctl/wgkey"
)

// The kernel's WireGuard device, where the kernel has the module: made
// like the VXLAN device (under a temporary name that carries the owner,
// marked, renamed: createVXLAN), configured over netlink with wgctrl. It
// outlives the controller, so a restart does not cut the segment, and the
// next controller adopts it (ensureWireGuard). NOT TESTED: the machine
// vmnetctl is developed and tested on has no WireGuard module; its tests
// run the userspace device, and only the fallback to it (the module's
// absence) is exercised here.

// errNoKernelWireGuard: the kernel cannot make WireGuard devices.
var errNoKernelWireGuard = errors.New("the kernel has no WireGuard module")

// kernelWireGuard is n's kernel WireGuard device l, if l is one and marked
// as n's by this state dir.
func kernelWireGuard(n *api.Network, l netlink.Link) (netlink.Link, bool) {
	if _, ok := l.(*netlink.Wireguard); !ok {
		return nil, false
	}
	owner, marked := hostnet.OwnedHere(l)
	return l, marked && owner == n.ID && hostnet.Mine(l.Attrs().Alias)
}

// createKernelWireGuard makes n's kernel device name; errNoKernelWireGuard
// without the module.
func createKernelWireGuard(n *api.Network, name string) (netlink.Link, error) {
	hostnet.RemoveStaleTmpBridges(n.ID)
	tmp := &netlink.Wireguard{LinkAttrs: netlink.LinkAttrs{Name: hostnet.TmpWireGuardName(n.ID), MTU: n.VXLAN.WireGuardMTU()}}
	if err := netlink.LinkAdd(tmp); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EINVAL) {
			return nil, errNoKernelWireGuard
		}
		return nil, fmt.Errorf("network %q: creating WireGuard device %s (as %s): %w", n.ID, name, tmp.Name, err)
	}
	return hostnet.MarkAndRename(n.ID, tmp.Name, name, "WireGuard device")
}

// kernelConfig is what host idx's kernel device of n is configured with.
func kernelConfig(n *api.Network, idx int, priv wgkey.Key) (wgtypes.Config, error) {
	x := n.VXLAN
	port := int(x.WireGuard.Port)
	ka := wgKeepalive
	cfg := wgtypes.Config{PrivateKey: (*wgtypes.Key)(&priv), ListenPort: &port, ReplacePeers: true}
	for i, h := range x.Hosts {
		if i == idx {
			continue
		}
		pub, err := api.ParseWireGuardKey(h.PublicKey)
		if err != nil {
			return cfg, fmt.Errorf("network %q: host %s: %w", n.ID, h.Name, err)
		}
		cfg.Peers = append(cfg.Peers, wgtypes.PeerConfig{
			PublicKey:                   wgtypes.Key(pub),
			Endpoint:                    &net.UDPAddr{IP: net.IP(h.Address.AsSlice()), Port: port},
			ReplaceAllowedIPs:           true,
			AllowedIPs:                  []net.IPNet{{IP: net.IP(x.TunnelAddr(i).AsSlice()), Mask: net.CIDRMask(32, 32)}},
			PersistentKeepaliveInterval: &ka,
		})
	}
	return cfg, nil
}

// kernelConfigured reports whether dev has cfg's key, port and peers (the
// same keys, endpoints and allowed addresses), so that Ensure does not
// reset sessions that are fine.
func kernelConfigured(dev *wgtypes.Device, cfg wgtypes.Config) bool {
	if dev.PrivateKey != *cfg.PrivateKey || dev.ListenPort != *cfg.ListenPort || len(dev.Peers) != len(cfg.Peers) {
		return false
	}
	for _, want := range cfg.Peers {
		i := slices.IndexFunc(dev.Peers, func(p wgtypes.Peer) bool { return p.PublicKey == want.PublicKey })
		if i < 0 {
			return false
		}
		p := dev.Peers[i]
		if p.Endpoint == nil || p.Endpoint.String() != want.Endpoint.String() || len(p.AllowedIPs) != 1 ||
			p.AllowedIPs[0].String() != want.AllowedIPs[0].String() {
			return false
		}
	}
	return true
}

// configureKernelWireGuard configures n's kernel device name unless it is
// configured so already.
func configureKernelWireGuard(n *api.Network, idx int, priv wgkey.Key, name string) error {
	cfg, err := kernelConfig(n, idx, priv)
	if err != nil {
		return err
	}
	c, err := wgctrl.New()
	if err != nil {
		return fmt.Errorf("network %q: configuring %s: %w", n.ID, name, err)
	}
	defer c.Close()
	if dev, err := c.Device(name); err == nil && kernelConfigured(dev, cfg) {
		return nil
	}
	if err := c.ConfigureDevice(name, cfg); err != nil {
		return fmt.Errorf("network %q: configuring %s: %w", n.ID, name, err)
	}
	return nil
}

// checkKernelWireGuard is checkWireGuard's part for a kernel device: its
// key, port and peers as configured.
func checkKernelWireGuard(n *api.Network, idx int, name string) error {
	priv, err := hostWireGuardKey()
	if err != nil {
		return fmt.Errorf("network %q: %w", n.ID, err)
	}
	cfg, err := kernelConfig(n, idx, priv)
	if err != nil {
		return err
	}
	c, err := wgctrl.New()
	if err != nil {
		return fmt.Errorf("network %q: reading %s: %w", n.ID, name, err)
	}
	defer c.Close()
	dev, err := c.Device(name)
	if err != nil {
		return fmt.Errorf("network %q: reading %s: %w", n.ID, name, err)
	}
	if !kernelConfigured(dev, cfg) {
		return fmt.Errorf("network %q: %s's key, port or peers are not as configured", n.ID, name)
	}
	return nil
}

// kernelWireGuardStats fills st's WireGuard part from kernel device name.
func kernelWireGuardStats(n *api.Network, name string, st *nettypes.TunnelStats) {
	c, err := wgctrl.New()
	if err != nil {
		return
	}
	defer c.Close()
	dev, err := c.Device(name)
	if err != nil {
		return
	}
	names := map[wgtypes.Key]string{}
	for _, h := range n.VXLAN.Hosts {
		if k, err := api.ParseWireGuardKey(h.PublicKey); err == nil {
			names[wgtypes.Key(k)] = h.Name
		}
	}
	for _, p := range dev.Peers {
		var hs time.Time
		if !p.LastHandshakeTime.IsZero() && p.LastHandshakeTime.Unix() > 0 {
			hs = p.LastHandshakeTime
		}
		st.WireGuard = append(st.WireGuard, nettypes.WireGuardPeer{Host: names[p.PublicKey], LastHandshake: hs,
			RxBytes: uint64(p.ReceiveBytes), TxBytes: uint64(p.TransmitBytes)})
	}
}
