package overlay

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/nettypes"
	"github.com/vmnetctl/vmnetctl/statedir"
	"github.com/vmnetctl/vmnetctl/wgkey"
)

// An encrypted segment (api.WireGuard): on each host a WireGuard device,
// vmw-NAME (api.WireGuardName), with the host's tunnel address
// (api.VXLAN.TunnelAddr) and one peer per other host (its public key, its
// underlay address and WireGuard port as endpoint, its tunnel address as
// its one allowed address). The VXLAN device sends from the tunnel address
// to the other hosts' tunnel addresses, so every VXLAN packet and name
// query between the hosts travels inside WireGuard.
//
// The device is wireguard-go (golang.zx2c4.com/wireguard) run inside this
// process, on a TUN device: this kernel has no WireGuard module, and the
// library needs no package on the host. It lives as long as the process
// (the controller), like the network's DHCP and DNS: a TUN device is the
// kernel's only while its file is open, so a crash at any instant leaves
// nothing behind to sweep, and the next run makes the device again (the
// VXLAN device, kept, finds its address back). Until then the hosts'
// segment is cut, as its names and leases are.

// wgDevices are this process's WireGuard devices, by network namespace
// and name.
var wgDevices = struct {
	sync.Mutex
	m map[string]*wgDevice
}{m: map[string]*wgDevice{}}

type wgDevice struct {
	dev   *device.Device
	index int    // its TUN's interface index
	conf  string // the configuration last set (wgConfig)
}

// alive reports whether d still runs on link l: wireguard-go closes a
// device whose TUN went away (deleted from outside).
func (d *wgDevice) alive(l netlink.Link) bool {
	select {
	case <-d.dev.Wait():
		return false
	default:
	}
	return l != nil && l.Attrs().Index == d.index
}

// wgKey names a device in wgDevices: the namespace of the calling thread
// and the device's name.
func wgKey(name string) string {
	if ns, ok := hostnet.ThreadNetNS(); ok {
		return fmt.Sprintf("%d/%s", ns.Ino, name)
	}
	return name
}

// hostWireGuardKey is this host's private key, made on first use for the
// state dir SetOwner named (statedir.Dir.WireGuardKeyFile).
func hostWireGuardKey() (wgkey.Key, error) {
	dir := hostnet.OwnerDir()
	if dir == "" {
		return wgkey.Key{}, errors.New("no state dir to keep this host's WireGuard key in")
	}
	path, err := statedir.Dir{Path: dir}.PrepareWireGuardKey()
	if err != nil {
		return wgkey.Key{}, err
	}
	return wgkey.LoadOrCreate(path)
}

// wgConfig is the configuration of host idx's device for n, in
// WireGuard's configuration protocol (wireguard.com/xplatform).
func wgConfig(n *api.Network, idx int, priv wgkey.Key) (string, error) {
	x := n.VXLAN
	var b strings.Builder
	fmt.Fprintf(&b, "private_key=%s\nlisten_port=%d\nreplace_peers=true\n", priv.Hex(), x.WireGuard.Port)
	for i, h := range x.Hosts {
		if i == idx {
			continue
		}
		pub, err := api.ParseWireGuardKey(h.PublicKey)
		if err != nil {
			return "", fmt.Errorf("network %q: host %s: %w", n.ID, h.Name, err)
		}
		fmt.Fprintf(&b, "public_key=%s\nendpoint=%s\nreplace_allowed_ips=true\nallowed_ip=%s/32\npersistent_keepalive_interval=%d\n",
			wgkey.Key(pub).Hex(), netip.AddrPortFrom(h.Address, x.WireGuard.Port), x.TunnelAddr(i), int(wgKeepalive/time.Second))
	}
	return b.String(), nil
}

// wgKeepalive keeps each peer's session up (and its handshake recent,
// which status shows), through NATs and stateful firewalls too.
const wgKeepalive = 25 * time.Second

// ensureWireGuard gives n, on this host, its WireGuard device as
// configured: made if missing, dead or not this process's; its key pair
// and peers; its tunnel address; up. A network without WireGuard has
// none (closed and deleted).
func ensureWireGuard(n *api.Network) error {
	name := api.WireGuardName(n.ID)
	if n.VXLAN == nil || n.VXLAN.WireGuard == nil {
		CloseWireGuard(n.ID)
		return nil
	}
	idx, _, err := LocalHost(n)
	if err != nil {
		return err
	}
	x := n.VXLAN
	priv, err := hostWireGuardKey()
	if err != nil {
		return fmt.Errorf("network %q: %w", n.ID, err)
	}
	if pub := priv.Public().String(); pub != x.Hosts[idx].PublicKey {
		return fmt.Errorf("network %q: this host (%s) has the WireGuard public key %s, and networks.yaml lists %s for it: put %s in vxlan.hosts[%d].publicKey on every host (vmnetctl wireguard pubkey prints it)",
			n.ID, x.Hosts[idx].Name, pub, x.Hosts[idx].PublicKey, pub, idx)
	}
	conf, err := wgConfig(n, idx, priv)
	if err != nil {
		return err
	}
	wgDevices.Lock()
	defer wgDevices.Unlock()
	key := wgKey(name)
	d := wgDevices.m[key]
	l, _ := netlink.LinkByName(name)
	if d != nil && !d.alive(l) {
		d.dev.Close()
		delete(wgDevices.m, key)
		d = nil
	}
	if kl, ok := kernelWireGuard(n, l); ok && d == nil {
		// The kernel's, made by this run or an earlier one: adopted.
		if err := configureKernelWireGuard(n, idx, priv, name); err != nil {
			return err
		}
		return wireGuardLink(n, idx, kl)
	}
	if d == nil {
		if l != nil {
			if err := removeWireGuardInTheWay(n, name, l); err != nil {
				return err
			}
		}
		switch kl, err := createKernelWireGuard(n, name); {
		case err == nil:
			if err := configureKernelWireGuard(n, idx, priv, name); err != nil {
				return err
			}
			return wireGuardLink(n, idx, kl)
		case !errors.Is(err, errNoKernelWireGuard):
			return err
		}
		if d, err = createWireGuard(n, name); err != nil {
			return err
		}
		// Configured and up (its port taken) before it is kept: a device
		// that cannot listen is closed, its TUN with it, and made again
		// next time, not left marked and deaf.
		if err := configureWireGuard(n, d, conf); err != nil {
			d.dev.Close()
			return err
		}
		if err := d.dev.Up(); err != nil {
			d.dev.Close()
			return wireGuardPortError(n, err)
		}
		wgDevices.m[key] = d
		if l, err = netlink.LinkByIndex(d.index); err != nil {
			return fmt.Errorf("network %q: %s: %w", n.ID, name, err)
		}
	}
	if err := configureWireGuard(n, d, conf); err != nil {
		return err
	}
	if err := d.dev.Up(); err != nil {
		return wireGuardPortError(n, err)
	}
	return wireGuardLink(n, idx, l)
}

// configureWireGuard gives d the configuration conf (wgConfig), unless it
// has it. Its port taken (by another program, or another state dir's
// network) is said in the file's terms.
func configureWireGuard(n *api.Network, d *wgDevice, conf string) error {
	if d.conf == conf {
		return nil
	}
	if err := d.dev.IpcSet(conf); err != nil {
		return wireGuardPortError(n, err)
	}
	d.conf = conf
	return nil
}

// wireGuardPortError is err, of configuring n's userspace device or
// setting it up (when it opens its port), with a port taken (by another
// program, or a network of another state dir) said in the file's terms.
func wireGuardPortError(n *api.Network, err error) error {
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("network %q: UDP port %d, its WireGuard port, is taken on this host (by another program, or a network of another state dir; ss -ulpn 'sport = :%d' says which): set networks.%s.vxlan.wireguard.port to a port free on every host",
			n.ID, n.VXLAN.WireGuard.Port, n.VXLAN.WireGuard.Port, n.ID)
	}
	return fmt.Errorf("network %q: WireGuard device %s: %w", n.ID, api.WireGuardName(n.ID), err)
}

// wireGuardLink gives n's WireGuard link l, kernel or TUN, its MTU and
// tunnel address, and sets it up.
func wireGuardLink(n *api.Network, idx int, l netlink.Link) error {
	x, name := n.VXLAN, l.Attrs().Name
	if l.Attrs().MTU != x.WireGuardMTU() {
		if err := netlink.LinkSetMTU(l, x.WireGuardMTU()); err != nil {
			return fmt.Errorf("network %q: %s's MTU: %w", n.ID, name, err)
		}
	}
	addr := netip.PrefixFrom(x.TunnelAddr(idx), x.WireGuard.Subnet.Bits())
	if err := hostnet.AddAddr(n, l, addr); err != nil {
		return err
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("network %q: setting %s up: %w", n.ID, name, err)
	}
	return nil
}

// removeWireGuardInTheWay deletes l, the link named as n's WireGuard
// device that is not one to keep: one marked as n's by this state dir is a
// device this process does not run (a previous run's, or one dead) and is
// made again; any other is not ours to take.
func removeWireGuardInTheWay(n *api.Network, name string, l netlink.Link) error {
	if owner, ok := hostnet.OwnedHere(l); !ok || owner != n.ID || !hostnet.Mine(l.Attrs().Alias) {
		return fmt.Errorf("network %q: a link named %s exists and is not this network's WireGuard device (alias %q): delete it, or give the network another name", n.ID, name, l.Attrs().Alias)
	}
	if err := netlink.LinkDel(l); err != nil && !hostnet.NotFound(err) {
		return fmt.Errorf("network %q: deleting %s to make it again: %w", n.ID, name, err)
	}
	return nil
}

// createWireGuard makes n's userspace device name, marked as n's. No
// temporary name is needed (createBridge's): the TUN goes with this
// process if it dies before the mark.
func createWireGuard(n *api.Network, name string) (*wgDevice, error) {
	t, err := tun.CreateTUN(name, n.VXLAN.WireGuardMTU())
	if err != nil {
		return nil, fmt.Errorf("network %q: creating WireGuard device %s: %w", n.ID, name, err)
	}
	log := slog.With("network", n.ID, "device", name)
	logger := &device.Logger{Verbosef: device.DiscardLogf, Errorf: func(format string, args ...any) { log.Warn(fmt.Sprintf(format, args...)) }}
	// Small batches (wgBatch): a device's buffers are a few MB, not 27.
	tn := newSmallBatchTUN(steadyTUN(t), n.VXLAN.WireGuardMTU(), device.MessageTransportHeaderSize)
	dev := device.NewDevice(tn, &smallBatchBind{Bind: conn.NewDefaultBind(), size: int(n.VXLAN.UnderlayMTU)}, logger)
	tl, err := netlink.LinkByName(name)
	if err == nil {
		err = netlink.LinkSetAlias(tl, hostnet.Mark(n.ID))
	}
	if err != nil {
		dev.Close()
		return nil, fmt.Errorf("network %q: marking WireGuard device %s: %w", n.ID, name, err)
	}
	return &wgDevice{dev: dev, index: tl.Attrs().Index}, nil
}

// steadyTUN is t without its events: on up and down, wireguard-go would
// take the device down and up again with its link, and open its sockets
// again on whatever thread reads the event, which may be in another
// network namespace than the device's (a process that serves several, as
// the tests do); on an MTU change it would read the MTU there too, and
// fail ("Failed to load updated MTU"). Up is vmnetctl's call
// (ensureWireGuard), and so is the MTU (wireGuardLink; wireguard-go reads
// it once, at NewDevice, for its padding); a link set down or given
// another MTU is drift, which Check reports and the repair puts back.
func steadyTUN(t tun.Device) tun.Device {
	s := &steadyDevice{Device: t, events: make(chan tun.Event)}
	go func() {
		defer close(s.events)
		for range t.Events() {
		}
	}()
	return s
}

type steadyDevice struct {
	tun.Device
	events chan tun.Event
}

func (s *steadyDevice) Events() <-chan tun.Event { return s.events }

// CloseWireGuard stops network id's WireGuard device of this process in
// the calling thread's namespace, and deletes its link.
func CloseWireGuard(id string) {
	name := api.WireGuardName(id)
	wgDevices.Lock()
	defer wgDevices.Unlock()
	key := wgKey(name)
	if d := wgDevices.m[key]; d != nil {
		d.dev.Close() // the TUN, and its link, with it
		delete(wgDevices.m, key)
	}
	if l, err := netlink.LinkByName(name); err == nil {
		if owner, ok := hostnet.OwnedHere(l); ok && owner == id && hostnet.Mine(l.Attrs().Alias) {
			netlink.LinkDel(l)
		}
	}
}

// checkWireGuard is CheckVXLAN's part for n's WireGuard device: running
// in this process, marked, up, with its MTU and tunnel address; none for
// a network without WireGuard.
func checkWireGuard(n *api.Network) []error {
	name := api.WireGuardName(n.ID)
	l, _ := netlink.LinkByName(name)
	if n.VXLAN == nil || n.VXLAN.WireGuard == nil {
		if l != nil {
			if owner, ok := hostnet.OwnedHere(l); ok && owner == n.ID && hostnet.Mine(l.Attrs().Alias) {
				return []error{fmt.Errorf("network %q: has the WireGuard device %s, and its underlay is no longer encrypted", n.ID, name)}
			}
		}
		return nil
	}
	idx, _, err := LocalHost(n)
	if err != nil {
		return []error{err}
	}
	wgDevices.Lock()
	d := wgDevices.m[wgKey(name)]
	wgDevices.Unlock()
	_, kernel := kernelWireGuard(n, l)
	switch {
	case l == nil:
		return []error{fmt.Errorf("network %q: WireGuard device %s is missing", n.ID, name)}
	case kernel:
		if err := checkKernelWireGuard(n, idx, name); err != nil {
			return []error{err}
		}
	case d == nil || !d.alive(l):
		return []error{fmt.Errorf("network %q: WireGuard device %s is not run by this controller", n.ID, name)}
	case l.Attrs().Alias != hostnet.Mark(n.ID):
		return []error{fmt.Errorf("network %q: %s is not marked as the network's", n.ID, name)}
	}
	var errs []error
	if l.Attrs().Flags&net.FlagUp == 0 {
		errs = append(errs, fmt.Errorf("network %q: %s is down", n.ID, name))
	}
	if l.Attrs().MTU != n.VXLAN.WireGuardMTU() {
		errs = append(errs, fmt.Errorf("network %q: %s has MTU %d, want %d", n.ID, name, l.Attrs().MTU, n.VXLAN.WireGuardMTU()))
	}
	want := netip.PrefixFrom(n.VXLAN.TunnelAddr(idx), n.VXLAN.WireGuard.Subnet.Bits())
	addrs, _ := hostnet.AddrsOf(l, netlink.FAMILY_V4)
	found := false
	for _, a := range addrs {
		if p, ok := hostnet.AddrPrefix(a.IPNet); ok && p == want {
			found = true
		}
	}
	if !found {
		errs = append(errs, fmt.Errorf("network %q: %s lacks its tunnel address %s", n.ID, name, want))
	}
	return errs
}

// wireGuardStats fills st's WireGuard part from n's device: each peer's
// last handshake and bytes.
func wireGuardStats(n *api.Network, st *nettypes.TunnelStats) {
	if n.VXLAN == nil || n.VXLAN.WireGuard == nil {
		return
	}
	name := api.WireGuardName(n.ID)
	wgDevices.Lock()
	d := wgDevices.m[wgKey(name)]
	wgDevices.Unlock()
	if d == nil {
		if l, _ := netlink.LinkByName(name); l != nil {
			if _, kernel := kernelWireGuard(n, l); kernel {
				kernelWireGuardStats(n, name, st)
			}
		}
		return
	}
	conf, err := d.dev.IpcGet()
	if err != nil {
		return
	}
	names := map[string]string{} // public key in hex → host name
	for _, h := range n.VXLAN.Hosts {
		if k, err := api.ParseWireGuardKey(h.PublicKey); err == nil {
			names[wgkey.Key(k).Hex()] = h.Name
		}
	}
	var p *nettypes.WireGuardPeer
	sc := bufio.NewScanner(strings.NewReader(conf))
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), "=")
		switch k {
		case "public_key":
			st.WireGuard = append(st.WireGuard, nettypes.WireGuardPeer{Host: names[v]})
			p = &st.WireGuard[len(st.WireGuard)-1]
		case "last_handshake_time_sec":
			if s, _ := strconv.ParseInt(v, 10, 64); p != nil && s > 0 {
				p.LastHandshake = time.Unix(s, 0)
			}
		case "rx_bytes":
			if p != nil {
				p.RxBytes, _ = strconv.ParseUint(v, 10, 64)
			}
		case "tx_bytes":
			if p != nil {
				p.TxBytes, _ = strconv.ParseUint(v, 10, 64)
			}
		}
	}
}
