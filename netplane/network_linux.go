package netplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/arplearn"
	"github.com/vmnetctl/vmnetctl/dhcpserver"
	"github.com/vmnetctl/vmnetctl/dnsproxy"
	"github.com/vmnetctl/vmnetctl/guard"
	"github.com/vmnetctl/vmnetctl/guestlog"
	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/leases"
	"github.com/vmnetctl/vmnetctl/nettypes"
	"github.com/vmnetctl/vmnetctl/overlay"
	"github.com/vmnetctl/vmnetctl/routeradv"
	"github.com/vmnetctl/vmnetctl/rtlink"
)

// Network is a running network: its kernel state ensured, its DHCP server
// and DNS proxy serving. The controller holds one per managed network.
type Network struct {
	n       *api.Network
	log     *slog.Logger
	alloc   *leases.Allocator // nil without DHCP
	hosts   *hostTable
	dhcp    *dhcpserver.Server
	dns     *dnsproxy.Proxy
	guard   *guard.AddrGuard  // nil when the guard does not check addresses
	ra      *routeradv.Server // nil without router advertisements
	fwd     forwardState
	fwdKick chan struct{} // a VM's address changed: apply the forwards again
	// egressApplied is the egress maps' content as last applied; names
	// the addresses learned for the policy's names.
	egressApplied string
	names         nameCache
	vmEgress      vmEgressState
	guard6        *guard.Guard6 // nil without IPv6
	// reservedChanged: the MACs whose IPv6 reservations SetHost or
	// RemoveHost changed since the guard's last sync of them (SetVMs).
	reservedMu      sync.Mutex
	reservedChanged []net.HardwareAddr
	onLease         func(kind, network, mac string, ip netip.Addr)
	onEgressDenied  func(network string, f nettypes.DeniedFlow)
	recent          recentNames        // the DNS proxy's answers, to name a denied flow
	deniedLog       *guestlog.ByClient // the denied flows told, a few a VM
	nameCheck       nameCheck
	learner4        *arplearn.Learner // nil when the network learns no IPv4 address
	// nsr runs functions (nft, which works in the namespace of the thread
	// that runs it) and dials in the network's namespace; nil before the
	// services start.
	nsr *nsRunner

	// failed is the first service that stopped on its own (Health).
	failed atomic.Pointer[error]

	closeOnce sync.Once
	closers   []func() error
	wg        sync.WaitGroup
	stop      chan struct{}
}

// Start ensures network n's kernel state (see Ensure) in the calling
// thread's network namespace and starts its services there: for shared and
// host networks, the DHCP server on the bridge (if n.DHCP) and the DNS
// proxy on the gateway's port 53, UDP and TCP (if n.DNSProxy). A bridged
// network has no services: its LAN provides them.
//
// ctx bounds the setup only: the services run until Close, which does not
// remove the kernel state (a vmnetctl restart must not cut the VMs off;
// Remove does that). Log lines carry the attribute network=<id>.
func Start(ctx context.Context, n *api.Network, opts Options) (*Network, error) {
	log := opts.Log
	if log == nil {
		log = slog.Default()
	}
	log = log.With("network", n.ID)
	if err := Ensure(ctx, n); err != nil {
		return nil, err
	}
	nw := &Network{n: n, log: log, hosts: newHostTable(), stop: make(chan struct{}), onLease: opts.OnLease, fwdKick: make(chan struct{}, 1),
		onEgressDenied: opts.OnEgressDenied, deniedLog: &guestlog.ByClient{Total: 20}}
	if !n.Routed() {
		return nw, nil
	}
	if err := nw.startServices(ctx, opts); err != nil {
		nw.Close()
		return nil, err
	}
	return nw, nil
}

// startServices starts a routed network's services, in this order: its
// addresses (the lease store), the IPv6 guard (before the DNS proxy, which
// answers AAAA from what it learns), the DNS proxy, the IPv4 guard, the
// DHCP server, the egress policy and what keeps it and the forwards up to
// date, the router advertisements. The caller closes nw on error.
func (nw *Network) startServices(ctx context.Context, opts Options) error {
	n := nw.n
	// Sockets are bound to the namespace they are created in; dials made
	// later, from goroutines on any thread, must go back to it.
	netns, err := ns.GetCurrentNS()
	if err != nil {
		return fmt.Errorf("network %q: %w", n.ID, err)
	}
	nsr, err := newNSRunner(netns)
	if err != nil {
		netns.Close()
		return fmt.Errorf("network %q: %w", n.ID, err)
	}
	nw.nsr = nsr // its netns closed after the services' goroutines, which use it
	if err := nw.openLeases(opts.StateDir); err != nil {
		return err
	}
	resolvConf := opts.ResolvConf
	if resolvConf == "" {
		resolvConf = "/etc/resolv.conf"
	}
	if guard.ChecksIPv6(n) {
		kick := func() {
			select {
			case nw.fwdKick <- struct{}{}:
			default:
			}
		}
		if nw.guard6, err = guard.StartGuard6(n, nw.log, nw.nsr.do, kick, nw.refreshVMEgress); err != nil {
			return err
		}
		nw.closers = append(nw.closers, nw.guard6.Close)
	}
	if n.DNSProxy {
		if err := nw.startDNS(resolvConf, opts.Upstreams); err != nil {
			return err
		}
		if n.VXLAN != nil {
			if err := nw.startPeerDNS(); err != nil {
				return err
			}
		}
	}
	if guard.ChecksAddresses(n) {
		if err := nw.startGuard(ctx); err != nil {
			return err
		}
	}
	if nameChecks(n) {
		if err := nw.startNameCheck(ctx); err != nil {
			return err
		}
	}
	if n.DHCP {
		if err := nw.startDHCP(resolvConf); err != nil {
			return err
		}
	}
	if err := nw.startLearner4(); err != nil {
		return err
	}
	if n.Routed() {
		if err := nw.startEgressLog(); err != nil {
			return err
		}
	}
	if n.HasIPv6() && !hostnet.KernelIPv6() {
		nw.log.Warn("IPv6 is off on this host (net.ipv6.conf.default.disable_ipv6=1, or ipv6.disable=1 at boot): the network runs without it; set ipv6: false on it to say so")
	}
	if err := nw.applyEgress(ctx); err != nil {
		return err
	}
	nw.wg.Add(1)
	go nw.keepUpToDate()
	if ipv6On(n) && n.RouterAdvertisement {
		return nw.startRA()
	}
	return nil
}

// openLeases opens the network's lease store, under stateDir (in memory
// without one). Every routed network keeps its addresses (leases,
// reservations, VM files' fixed addresses), DHCP or not: the guard binds
// them. Across hosts, this host's DHCP serves its slice of the range.
func (nw *Network) openLeases(stateDir string) error {
	path := ""
	if stateDir != "" {
		path = LeaseFile(stateDir, nw.n.ID)
	}
	mine, err := overlay.HostNetwork(nw.n)
	if err != nil {
		return err
	}
	if nw.alloc, err = leases.NewAllocator(mine, path); err != nil {
		return err
	}
	if why := nw.alloc.SetAside(); why != "" {
		kept := nw.leasesFromGuard()
		nw.log.Warn("the network's lease file was unreadable; its leases are rebuilt from its journal and the guard", "detail", why, "fromGuard", kept)
		if nw.onLease != nil {
			nw.onLease("leases-rebuilt", nw.n.ID, "", netip.Addr{})
		}
	}
	return nil
}

// leasesFromGuard gives the VMs whose (MAC, address) pairs the guard
// holds, and that the lease store has no lease for, a lease of that
// address again: after a lease file was set aside, the VMs keep the
// addresses they use (the guard lets them) instead of losing them at
// their next renewal. It returns how many.
func (nw *Network) leasesFromGuard() int {
	g, err := guard.NewAddrGuard(nw.n, nw.alloc, nw.log, nw.nsr.do)
	if err != nil {
		return 0
	}
	pairs, err := g.Installed(context.Background())
	if err != nil {
		return 0
	}
	kept := 0
	for m, ips := range pairs {
		mac, err := net.ParseMAC(m)
		if err != nil || len(ips) == 0 {
			continue
		}
		if _, ok := nw.alloc.Lookup(mac); ok {
			continue
		}
		for _, ip := range ips {
			if _, err := nw.alloc.Commit(mac, ip, ""); err == nil {
				kept++
				break
			}
		}
	}
	return kept
}

// keepUpToDate applies the forwards and the VMs' egress policies again
// when a VM's address changes (fwdKick), and the egress policy when the
// host's LANs may have, until the network stops.
func (nw *Network) keepUpToDate() {
	defer nw.wg.Done()
	lan := time.NewTicker(egressRefresh)
	defer lan.Stop()
	for {
		select {
		case <-nw.stop:
			return
		case <-nw.fwdKick:
			nw.refreshForwards()
			nw.refreshVMEgress()
		case <-lan.C: // the host's LANs may have changed
			if err := nw.applyEgress(context.Background()); err != nil {
				nw.log.Error("the egress policy is not up to date", "err", err)
			}
			nw.refreshVMEgress()
		}
	}
}

// startDNS starts the DNS proxy on the gateway's port 53, UDP and TCP. It
// forwards to upstreams, by default the resolvers of resolvConf, dialing
// them from the network's namespace.
//
// Its sockets are bound to the gateway address and, with SO_BINDTODEVICE,
// to an interface: one pair to the network's bridge, one pair to lo. The
// kernel then hands them only packets that came in on that interface. A
// socket bound to the gateway address alone is not enough: Linux is a weak
// host and delivers a packet for any of its addresses whatever interface it
// arrives on, so a LAN neighbour with a route to the gateway address
// (through the host's uplink) would be answered, and a source-address check
// would not stop it either, since it can forge a VM's source address (it
// needs no answer to make the host forward for it). The ingress interface
// cannot be forged from outside: a packet arrives on the bridge only from a
// port of the bridge (a VM), and on lo only from the host itself (the
// kernel routes the host's own packets to a local address through lo, and
// drops a packet from outside that claims a local source address).
func (nw *Network) startDNS(resolvConf string, upstreams []string) error {
	if len(upstreams) == 0 {
		// The proxy runs on the host, so a loopback stub resolver
		// (systemd-resolved's 127.0.0.53) is as good as any.
		upstreams, _ = dnsproxy.ResolvConfServers(resolvConf, false)
	}
	nw.dns = &dnsproxy.Proxy{
		Resolve:   resolver(nw.hosts, nw.alloc),
		FileName:  func(name string) bool { _, ok := nw.hosts.mac(name); return ok },
		Resolve6:  nw.resolve6(),
		Learn:     nw.learnNames,
		NoECH:     nw.underNamePolicy,
		Upstreams: upstreams,
		NoForward: !nw.n.ForwardsDNS(),
		Log:       nw.log,
		Dial:      nw.nsr.dial,
	}
	nw.closers = append(nw.closers, nw.dns.CloseIdle)
	type listen struct{ udp, tcp, addr, dev string }
	var listens []listen
	for _, dev := range []string{nw.n.Bridge(), "lo"} {
		listens = append(listens, listen{"udp4", "tcp4", net.JoinHostPort(nw.n.Gateway.String(), "53"), dev})
		if ipv6On(nw.n) {
			listens = append(listens, listen{"udp6", "tcp6", net.JoinHostPort(nw.n.Gateway6.String(), "53"), dev})
		}
	}
	for _, l := range listens {
		addr, dev := l.addr, l.dev
		lc := net.ListenConfig{Control: bindToDevice(dev)}
		pc, err := lc.ListenPacket(context.Background(), l.udp, addr)
		if err != nil {
			return fmt.Errorf("network %q: DNS proxy on %s %s: %w", nw.n.ID, dev, addr, err)
		}
		ln, err := lc.Listen(context.Background(), l.tcp, addr)
		if err != nil {
			pc.Close()
			return fmt.Errorf("network %q: DNS proxy on %s %s: %w", nw.n.ID, dev, addr, err)
		}
		for _, s := range nw.dns.Servers(pc.(*net.UDPConn), ln) {
			nw.wg.Add(1)
			go func() {
				defer nw.wg.Done()
				if err := s.Serve(); err != nil && !nw.stopped() {
					nw.log.Error("DNS proxy stopped", "err", err)
					nw.fail(fmt.Errorf("network %q: the DNS proxy stopped: %w", nw.n.ID, err))
				}
			}()
			nw.closers = append(nw.closers, s.Stop)
		}
	}
	return nil
}

// bindToDevice is a net.ListenConfig Control that binds the socket to the
// interface dev (SO_BINDTODEVICE), before it is bound to its address: two
// sockets on the same address and port bound to different interfaces do
// not conflict.
func bindToDevice(dev string) func(network, address string, c syscall.RawConn) error {
	return func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptString(int(fd), unix.SOL_SOCKET, unix.SO_BINDTODEVICE, dev)
		}); err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("SO_BINDTODEVICE %s: %w", dev, serr)
		}
		return nil
	}
}

// bound has what follows a VM's addresses follow a change of mac's, before
// the VM hears of it (DHCP's ACK, the learner's binding): the guard, the
// VMs' egress policies, the forwards.
func (nw *Network) bound(mac net.HardwareAddr) {
	if nw.guard != nil {
		nw.guard.SyncMAC(context.Background(), mac)
	}
	// A VM's own egress policy is keyed by its address: in force before
	// the VM hears of the address, or its first connections would be
	// judged by the network's policy (a few milliseconds, and only on
	// networks where some VM has a policy of its own).
	nw.refreshVMEgress()
	select { // the forwards follow the VM's address
	case nw.fwdKick <- struct{}{}:
	default:
	}
}

// startLearner4 starts the network's IPv4 address learner (package
// arplearn), if it learns addresses; the network's guard, egress policies
// and forwards follow what it binds.
func (nw *Network) startLearner4() error {
	l, err := arplearn.Start(arplearn.Config{Network: nw.n, Alloc: nw.alloc, Guard: nw.guard, InNS: nw.nsr.do, Log: nw.log,
		Bound: nw.bound, OnLease: nw.onLease})
	if err != nil || l == nil {
		return err
	}
	nw.learner4 = l
	nw.closers = append(nw.closers, func() error { l.Close(); return nil })
	return nil
}

// startDHCP starts the DHCP server on the network's bridge. Its DNS server
// is the gateway's proxy, or without one the host's resolvers.
func (nw *Network) startDHCP(resolvConf string) error {
	var dnsServers []netip.Addr
	if nw.n.DNSProxy {
		dnsServers = []netip.Addr{nw.n.Gateway}
	} else {
		dnsServers = dnsproxy.HostResolvers(resolvConf, "/run/systemd/resolve/resolv.conf")
	}
	nw.dhcp = dhcpserver.New(nw.n, nw.alloc, dnsServers, nw.log)
	nw.dhcp.OnLease = nw.onLease
	nw.dhcp.Bound = nw.bound
	sock, err := dhcpserver.Listen(nw.n.Bridge())
	if err != nil {
		return fmt.Errorf("network %q: DHCP server on %s: %w", nw.n.ID, nw.n.Bridge(), err)
	}
	nw.closers = append(nw.closers, sock.Close)
	nw.wg.Add(1)
	go func() {
		defer nw.wg.Done()
		if err := dhcpserver.Serve(sock, nw.dhcp, nw.stop); err != nil && !nw.stopped() {
			nw.log.Error("DHCP server stopped", "err", err)
			nw.fail(fmt.Errorf("network %q: the DHCP server stopped: %w", nw.n.ID, err))
		}
	}()
	return nil
}

// raRouterLifetime is how long a VM keeps the gateway as its IPv6 default
// router after an advertisement (RFC 4861's default is 3 times the longest
// interval; advertisements come every few minutes).
const raRouterLifetime = 30 * time.Minute

// startRA advertises the network's IPv6 prefix on the bridge for SLAAC,
// with its MTU and, with the DNS proxy, the gateway as DNS server and
// vmnet.internal as search domain. Only a network whose IPv6 traffic
// leaves the host (RoutesIPv6) makes the gateway a default router.
func (nw *Network) startRA() error {
	cfg := routeradv.Config{Iface: nw.n.Bridge(), Prefix: nw.n.Subnet6, MTU: nw.n.MTU}
	if nw.n.RoutesIPv6() {
		cfg.RouterLifetime = raRouterLifetime
	}
	if nw.n.DNSProxy {
		cfg.RDNSS, cfg.DNSSL = []netip.Addr{nw.n.Gateway6}, []string{dnsproxy.Domain}
	}
	ra, err := routeradv.Start(cfg, nw.log)
	if err != nil {
		return fmt.Errorf("network %q: %w", nw.n.ID, err)
	}
	nw.ra = ra
	nw.closers = append(nw.closers, ra.Close)
	return nil
}

// startGuard keeps the guard's addresses up to date: now, and every
// guardResync, which drops the pairs of leases that expired.
func (nw *Network) startGuard(ctx context.Context) error {
	g, err := guard.NewAddrGuard(nw.n, nw.alloc, nw.log, nw.nsr.do)
	if err != nil {
		return err
	}
	if err := g.Sync(ctx, true); err != nil {
		return err
	}
	nw.guard = g
	nw.wg.Add(1)
	go func() {
		defer nw.wg.Done()
		t := time.NewTicker(guard.Resync)
		defer t.Stop()
		for {
			select {
			case <-nw.stop:
				return
			case <-t.C:
				g.LogFailure(g.SyncAll(context.Background()))
			}
		}
	}()
	return nil
}

// fail records that a service stopped on its own, and tells the
// controller's watch (WatchChanges), which repairs the network.
func (nw *Network) fail(err error) {
	if nw.failed.CompareAndSwap(nil, &err) {
		services.notify()
	}
}

// Health is nil while every service of the network runs, else why one
// stopped: the controller then starts the network again.
func (nw *Network) Health() error {
	if p := nw.failed.Load(); p != nil {
		return *p
	}
	return nil
}

func (nw *Network) stopped() bool {
	select {
	case <-nw.stop:
		return true
	default:
		return false
	}
}

// Close stops the network's services and waits for them. The kernel state
// stays. Closing twice is fine.
func (nw *Network) Close() error {
	var errs []error
	nw.closeOnce.Do(func() {
		close(nw.stop)
		for i := len(nw.closers) - 1; i >= 0; i-- {
			if err := nw.closers[i](); err != nil && !errors.Is(err, net.ErrClosed) {
				errs = append(errs, err)
			}
		}
		nw.wg.Wait()
		if nw.alloc != nil {
			// A compaction under way ends before another allocator
			// may load the lease file.
			nw.alloc.Close()
		}
		if nw.nsr != nil {
			errs = append(errs, nw.nsr.netns.Close())
		}
	})
	return errors.Join(errs...)
}

// Config is the network the services run for.
func (nw *Network) Config() *api.Network { return nw.n }

// SetHost tells the network that the VM with this MAC is called name, for
// the DNS proxy (name.vmnet.internal), and, if ip is valid, pins the MAC to
// that address in DHCP (a VM file's `ip:`). An empty name forgets the name.
func (nw *Network) SetHost(mac net.HardwareAddr, name string, ip netip.Addr) error {
	if name != "" && !dnsproxy.ValidHostName(name) {
		return fmt.Errorf("network %q: VM name %q cannot be a DNS name (letters, digits, '-' and '_' only)", nw.n.ID, name)
	}
	if ip.IsValid() {
		if nw.alloc == nil {
			return fmt.Errorf("network %q: fixed address %s for %s: the network has no DHCP server", nw.n.ID, ip, mac)
		}
		if err := nw.alloc.SetFixed(mac, ip); err != nil {
			return err
		}
	}
	nw.hosts.set(mac, name)
	if nw.alloc != nil {
		nw.alloc.SetPresent(mac, true) // its lease outlives its expiry while it is attached
	}
	if nw.guard != nil {
		nw.guard.SyncMAC(context.Background(), mac)
	}
	if nw.guard6 != nil && nw.guard6.Learner.Reserve(mac, true) {
		// A VM's EUI-64 addresses are its own before it boots, in the
		// guard too (SetVMs puts them there, once for all the VMs).
		nw.reserveChanged(mac)
	}
	return nil
}

// SetImpairments makes ps what the network's ports lose on purpose
// (guard.SetImpairments), none for the others.
func (nw *Network) SetImpairments(ps []nettypes.PortImpairment) error {
	if !guard.Guarded(nw.n) || nw.nsr == nil {
		return nil
	}
	return nw.nsr.do(func() error { return guard.SetImpairments(context.Background(), nw.n, ps) })
}

// SetPartitions makes the pairs of VMs (by MAC, each way) whose frames
// the network's guard drops exactly pairs (guard.SetPartitionPairs).
// A network without a guard (bridged: no services, no namespace of its
// own kept) has none.
func (nw *Network) SetPartitions(pairs [][2]net.HardwareAddr) error {
	if !guard.Guarded(nw.n) || nw.nsr == nil {
		return nil
	}
	return nw.nsr.do(func() error { return guard.SetPartitionPairs(context.Background(), nw.n, pairs) })
}

// SetVMs ends a round of SetHost calls: names are the names VM files
// define on any network of the state dir, which are never a DHCP client's
// here (the DNS proxy answers a name of a VM that is not on this network
// with nothing); macs are this network's VMs', and a VM SetHost was told
// of that is not among them has gone (RemoveHost). The guard's
// reservations change in one sync, if they changed.
func (nw *Network) SetVMs(names []string, macs []net.HardwareAddr) {
	defer nw.learner4.VMsKnown()
	nw.hosts.reserve(names)
	keep := map[string]bool{}
	for _, m := range macs {
		keep[m.String()] = true
	}
	for _, m := range nw.hosts.macs() {
		if !keep[m] {
			if hw, err := net.ParseMAC(m); err == nil {
				nw.RemoveHost(hw)
			}
		}
	}
	nw.syncReserved()
}

// ChangeVMs ends a round of SetHost calls that told only of the VMs new
// or changed since the last round (SetVMs or ChangeVMs): added and
// removed are the names VM files define on any network of the state dir
// that came and went, gone the MACs of this network's VMs that went
// (RemoveHost). What it costs grows with what changed, not with the VMs.
func (nw *Network) ChangeVMs(added, removed []string, gone []net.HardwareAddr) {
	defer nw.learner4.VMsKnown()
	nw.hosts.changeReserved(added, removed)
	for _, m := range gone {
		nw.RemoveHost(m)
	}
	nw.syncReserved()
}

// syncReserved gives the IPv6 guard the reservations that changed since
// the last round, in one sync.
func (nw *Network) syncReserved() {
	if nw.guard6 == nil {
		return
	}
	nw.reservedMu.Lock()
	changed := nw.reservedChanged
	nw.reservedChanged = nil
	nw.reservedMu.Unlock()
	if len(changed) > 0 {
		nw.guard6.SyncReservedOf(changed)
	}
}

// reserveChanged notes that mac's IPv6 reservations changed, for SetVMs.
func (nw *Network) reserveChanged(mac net.HardwareAddr) {
	nw.reservedMu.Lock()
	defer nw.reservedMu.Unlock()
	nw.reservedChanged = append(nw.reservedChanged, slices.Clone(mac))
}

// RemoveHost forgets the name and run-time fixed address of a MAC, and
// the IPv6 addresses it was using and had reserved. Its lease is kept
// until it expires (no longer past it: its VM is gone).
func (nw *Network) RemoveHost(mac net.HardwareAddr) {
	nw.hosts.set(mac, "")
	if nw.guard6 != nil {
		if nw.guard6.Learner.Reserve(mac, false) {
			nw.reserveChanged(mac) // (SetVMs syncs)
		}
		nw.guard6.Learner.Forget(mac)
	}
	if nw.alloc != nil {
		nw.alloc.ClearFixed(mac)
		nw.alloc.SetPresent(mac, false)
	}
	if nw.guard != nil {
		nw.guard.SyncMAC(context.Background(), mac)
	}
}

// Leases returns the current (unexpired) DHCP leases, by address.
func (nw *Network) Leases() []leases.Lease {
	if nw.alloc == nil {
		return nil
	}
	return nw.alloc.Leases()
}

// portMACs returns the MACs the bridge learned on each of its ports (not
// the ports' own), by port name, from its forwarding database.
//
// ports, if not nil, are the only ports asked about. A few are dumped
// port by port (hostnet.FDBOf); but the kernel walks the bridge's whole
// database for each, so more than bulkPorts (a project's status of a
// fleet: a thousand ports took 0.17 s), like all of them, are read from
// the bridge's brforward file (guard.BridgeFDB) in one walk; where sysfs
// shows another namespace, in one dump of the bridge's (FDBOfBridge: a
// walk a port, but not of every link of the host a port as FDBOf of each
// port: 6 s with 10,000 VMs).
func portMACs(bridge string, ports []string) map[string][]string {
	br, err := netlink.LinkByName(bridge)
	if err != nil {
		return nil
	}
	out := map[string][]string{}
	add := func(name string, mac net.HardwareAddr) {
		if m := mac.String(); !slices.Contains(out[name], m) {
			out[name] = append(out[name], m)
		}
	}
	names := map[int]string{}
	if ports == nil || len(ports) > bulkPorts {
		links, err := hostnet.PortsOf(br.Attrs().Index)
		if err != nil {
			return nil
		}
		asked := map[string]bool{}
		for _, p := range ports {
			asked[p] = true
		}
		for _, l := range links {
			if ports == nil || asked[l.Name] {
				names[l.Index] = l.Name
			}
		}
		if fdb, err := guard.BridgeFDB(br, links); err == nil {
			for idx, macs := range fdb {
				if name, ok := names[idx]; ok {
					for _, mac := range macs {
						add(name, mac)
					}
				}
			}
			return out
		}
		// sysfs shows another namespace: one dump of the bridge's.
		neighs, err := hostnet.FDBOfBridge(br.Attrs().Index)
		if err != nil {
			return nil
		}
		for _, n := range neighs {
			if name, ok := names[n.LinkIndex]; ok && n.State&netlink.NUD_PERMANENT == 0 && n.HardwareAddr != nil {
				add(name, n.HardwareAddr)
			}
		}
		return out
	}
	for _, p := range ports {
		l, err := netlink.LinkByName(p)
		if err == nil && l.Attrs().MasterIndex == br.Attrs().Index {
			names[l.Attrs().Index] = p
		}
	}
	for idx, name := range names {
		neighs, err := hostnet.FDBOf(idx)
		if err != nil {
			continue
		}
		for _, n := range neighs {
			if n.State&netlink.NUD_PERMANENT == 0 && n.HardwareAddr != nil && n.MasterIndex == br.Attrs().Index {
				add(name, n.HardwareAddr)
			}
		}
	}
	return out
}

// bulkPorts is how many ports portMACs reads port by port: about the
// cost of one link dump of a thousand ports and one read of brforward.
const bulkPorts = 40

// Stats returns the counters of the DHCP server and DNS proxy, and what q
// asks of the ports.
func (nw *Network) Stats(q nettypes.StatsQuery) nettypes.ServiceStats {
	ports := q.Ports
	var s nettypes.ServiceStats
	if nw.dhcp != nil {
		s.DHCP = nw.dhcp.Stats()
	}
	if nw.dns != nil {
		s.DNS = nw.dns.Stats()
	}
	if nw.nsr != nil {
		// Bounded: the controller holds its lock while it asks.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		nw.nsr.do(func() error {
			conns, err := forwardConns(ctx, nw.n.ID)
			s.ForwardConns = conns
			s.NeighLimited = neighLimited(ctx, nw.n.ID)
			nw.vmEgress.mu.Lock()
			vmPolicies := len(nw.vmEgress.policies) > 0
			nw.vmEgress.mu.Unlock()
			if nw.n.Egress != nil || vmPolicies {
				s.EgressDenied = egressDenied(ctx, nw.n.ID) + nw.nameCheck.refusedTotal()
				s.EgressDeniedByMAC = nw.deniedByMAC()
			}
			return err
		})
	}
	if nw.ra != nil {
		s.IPv6.RouterAdvertisements, s.IPv6.Solicitations, s.IPv6.SolicitationsLimited = nw.ra.Stats()
	}
	if nw.guard6 != nil {
		l := nw.guard6.Learner
		s.IPv6.Claims, s.IPv6.Conflicts, s.IPv6.Refused = l.Stats()
		s.IPv6Addrs = map[string][]netip.Addr{}
		for _, b := range l.Bindings() {
			if nw.n.Subnet6.Contains(b.IP) {
				s.IPv6Addrs[b.MAC.String()] = append(s.IPv6Addrs[b.MAC.String()], b.IP)
			}
			s.IPv6.Bindings++
		}
		for _, ips := range s.IPv6Addrs {
			slices.SortFunc(ips, netip.Addr.Compare)
		}
	}
	if guard.Guarded(nw.n) && nw.nsr != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		nw.nsr.do(func() error {
			only := ports
			if nw.n.VXLAN != nil {
				only = nil // (the tunnel's counters are among them)
			}
			drops, err := guard.Drops(ctx, nw.n.ID, only)
			s.GuardDrops = drops
			if q.MACs {
				s.PortMACs = portMACs(nw.n.Bridge(), ports)
			}
			if nw.n.VXLAN != nil {
				s.Tunnel = overlay.TunnelStats(nw.n, drops)
			}
			return err
		})
	}
	return s
}

// TapCounts reads the kernel's counters of ports taps (TAPs a VMM
// drives: backend.TapCounter): each with a request of its own when they
// are few, else in one dump of the bridge's ports; a port it could not
// read is missing (as a helper's stats line that did not come).
func (nw *Network) TapCounts(taps []string) map[string]helperproto.TapCounts {
	var out map[string]helperproto.TapCounts
	read := func() error {
		out = tapCounts(nw.n, taps)
		return nil
	}
	if nw.nsr != nil {
		nw.nsr.do(read) // (the namespace's thread: its links)
	} else {
		read()
	}
	return out
}

// tapCounts reads the counters of ports taps of network n.
func tapCounts(n *api.Network, taps []string) map[string]helperproto.TapCounts {
	c, err := rtlink.Open()
	if err != nil {
		return nil
	}
	defer c.Close()
	out := make(map[string]helperproto.TapCounts, len(taps))
	if len(taps) <= tapLookups {
		for _, t := range taps {
			if l, err := c.LinkByName(t); err == nil {
				out[t] = l.TapCounts()
			}
		}
		return out
	}
	br, err := PortBridge(n)
	if err != nil || br == "" {
		return nil
	}
	index, err := hostnet.LinkIndex(br)
	if err != nil || index == 0 {
		return nil
	}
	ports, err := c.Ports(int(index))
	if err != nil {
		return nil
	}
	want := make(map[string]bool, len(taps))
	for _, t := range taps {
		want[t] = true
	}
	for _, p := range ports {
		if want[p.Name] {
			out[p.Name] = p.TapCounts()
		}
	}
	return out
}

// tapLookups is how many TAPs tapCounts reads one by one, rather than in
// a dump of all the bridge's ports (a lookup is about 25 us here, a port
// of a dump about 3: 0.8 to 1.1 ms for a bridge of 300).
const tapLookups = 16

// resolve6 is the DNS proxy's AAAA resolver: nil without IPv6.
func (nw *Network) resolve6() func(string) []netip.Addr {
	if nw.guard6 == nil {
		return nil
	}
	return resolver6(nw.hosts, nw.alloc, nw.guard6.Learner)
}

// deniedByMAC is egressDeniedBy by the VMs' MACs: an IPv4 source by its
// lease (or fixed address), an IPv6 one by the guard's binding.
func (nw *Network) deniedByMAC() map[string]uint64 {
	by, _ := egressDeniedBy(nw.n.ID)
	nw.nameCheck.addRefused(by)
	if len(by) == 0 {
		return nil
	}
	macOf := map[netip.Addr]string{}
	if nw.alloc != nil {
		for _, l := range nw.alloc.Leases() {
			macOf[l.IP] = l.MAC
		}
	}
	out := map[string]uint64{}
	for ip, n := range by {
		mac, ok := macOf[ip]
		if !ok && nw.guard6 != nil {
			if hw, bound := nw.guard6.Learner.Owner(ip); bound {
				mac, ok = hw.String(), true
			}
		}
		if ok {
			out[mac] += n
		}
	}
	return out
}
