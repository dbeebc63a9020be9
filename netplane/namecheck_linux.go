package netplane

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/egressproxy"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/nettypes"
)

// The name check: a VM's TCP connections to ports 80 and 443 of the
// addresses its policy allows by name are redirected (nameCheckRedirects)
// to the network's egressproxy, which lets them through only if the TLS
// server name or HTTP Host they ask for is one the policy allows; where
// the kernel queues packets (nameGates), those to port 443 go through the
// gate instead (gate_linux.go).

// nameCheck is a network's proxy and what it refused.
type nameCheck struct {
	proxy *egressproxy.Proxy
	// lan is the host's LANs as the policies were last applied with
	// (the "lan" alias of an address's verdict).
	lan atomic.Pointer[[]netip.Prefix]

	mu      sync.Mutex
	refused map[netip.Addr]uint64 // by source, at most egressSources
	total   uint64
}

// startNameCheck listens for the redirected connections, IPv4 and IPv6,
// on ports the kernel picks, bound to the bridge (as the DNS proxy is:
// only the VMs reach it), and points the redirects at them.
func (nw *Network) startNameCheck(ctx context.Context) error {
	nc := &nw.nameCheck
	nc.proxy = egressproxy.New(egressproxy.Config{
		Allow:    nw.nameAllowed,
		Dial:     nw.nsr.dial,
		Denied:   nw.nameRefused,
		Client:   nw.macOf, // a VM's connections bounded, whatever its addresses
		CheckDst: nw.outward,
		OuterECH: nw.outerECH,
		Log:      nw.log,
	})
	nw.closers = append(nw.closers, nc.proxy.Close)
	proxied := []string{"80", "443"}
	if nameGates(nw.n) {
		if err := nw.startGate(); err != nil {
			return err
		}
		proxied = proxied[:1]
	}
	nft, err := hostnet.NFT(knftables.InetFamily, nw.n.ID)
	if err != nil {
		return err
	}
	tx := nft.NewTransaction()
	addEgressObjects(tx)
	for _, m := range []string{egressProxy4, egressProxy6} {
		tx.Flush(&knftables.Map{Name: m})
	}
	tx.Flush(&knftables.Set{Name: egressProxyPorts})
	for _, l := range []struct{ network, addr, m string }{{"tcp4", "0.0.0.0:0", egressProxy4}, {"tcp6", "[::]:0", egressProxy6}} {
		if l.network == "tcp6" && !hostnet.KernelIPv6() {
			continue // (its connections are refused: nameCheckFallback)
		}
		bind := bindToDevice(nw.n.Bridge())
		lc := net.ListenConfig{Control: func(network, address string, c syscall.RawConn) error {
			if err := bind(network, address, c); err != nil {
				return err
			}
			var serr error
			if err := c.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, nameCheckMark)
			}); err != nil {
				return err
			}
			return serr
		}}
		ln, err := lc.Listen(ctx, l.network, l.addr)
		if err != nil {
			return fmt.Errorf("network %q: the name check's %s listener: %w", nw.n.ID, l.network, err)
		}
		port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
		for _, from := range proxied {
			tx.Add(&knftables.Element{Map: l.m, Key: []string{from}, Value: []string{port}})
		}
		tx.Add(&knftables.Element{Set: egressProxyPorts, Key: []string{port}})
		nw.wg.Add(1)
		go func() {
			defer nw.wg.Done()
			if err := nc.proxy.Serve(ln); err != nil && !nw.stopped() {
				nw.log.Error("the name check stopped", "err", err)
				nw.fail(fmt.Errorf("network %q: the name check stopped: %w", nw.n.ID, err))
			}
		}()
	}
	if err := nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("network %q: the name check's ports: %w", nw.n.ID, err)
	}
	return nil
}

// nameAllowed is the name check's verdict: the policy of src (its VM's
// own, else the network's) on the name asked for; a name it does not
// list (or none) gets what it says of dst's address by prefix.
func (nw *Network) nameAllowed(src, dst netip.AddrPort, name string) bool {
	e, _ := nw.ownPolicy(src.Addr())
	if e == nil {
		e = nw.n.Egress
	}
	if e == nil {
		return true // no policy left (since the redirect): nothing to check
	}
	if name != "" {
		if allow, ok := e.NameVerdict(strings.Split(name, ".")); ok {
			return allow
		}
	}
	var lan []netip.Prefix
	if p := nw.nameCheck.lan.Load(); p != nil {
		lan = *p
	}
	return addrAllowed(e, dst.Addr(), lan)
}

// outerECH reports whether the policy of the VM at src (its own, else the
// network's) judges an encrypted ClientHello by its outer name (`ech:
// outer`).
func (nw *Network) outerECH(src netip.AddrPort) bool {
	e, _ := nw.ownPolicy(src.Addr())
	if e == nil {
		e = nw.n.Egress
	}
	return e != nil && e.ECHOuter
}

// underNamePolicy reports whether the policy of the VM at client (its
// own, else the network's) lists names: its DNS answers lose their ECH
// configurations, so that it sends the name check a ClientHello it can
// read.
func (nw *Network) underNamePolicy(client netip.Addr) bool {
	e, _ := nw.ownPolicy(client)
	if e == nil {
		e = nw.n.Egress
	}
	return e != nil && e.HasNames()
}

// outward says why the name check must not dial dst ("" if it may): an
// address the forward chain would never let a VM's connection reach
// through the host (the proxy dials from the host itself), whatever name
// the VM asked for: the host's own (loopback, its addresses), none to go
// out to (unspecified, link-local, multicast, IPv4 written as IPv6), or a
// VM's of one of vmnetctl's networks (a bridge of ours is the way to it).
func (nw *Network) outward(dst netip.Addr) string {
	if !dst.IsValid() || dst.IsLoopback() || dst.IsUnspecified() || dst.IsLinkLocalUnicast() ||
		dst.IsMulticast() || dst.IsInterfaceLocalMulticast() || dst.Is4In6() || dst == netip.IPv4Unspecified() {
		return "an address no connection goes out to"
	}
	why := ""
	err := nw.nsr.do(func() error {
		routes, err := netlink.RouteGet(net.IP(dst.AsSlice()))
		if err != nil || len(routes) == 0 {
			why = "an address with no route"
			return nil
		}
		r := routes[0]
		if r.Type == unix.RTN_LOCAL {
			why = "an address of the host's"
			return nil
		}
		l, err := netlink.LinkByIndex(r.LinkIndex)
		switch {
		case err != nil:
			why = "an address whose way out cannot be read"
		case strings.HasPrefix(l.Attrs().Alias, hostnet.AliasPrefix):
			why = "a VM's address, behind " + l.Attrs().Name
		}
		return nil
	})
	if err != nil {
		return "an address whose route cannot be read"
	}
	return why
}

// addrAllowed is what e says of address a by its prefixes and aliases.
func addrAllowed(e *api.Egress, a netip.Addr, lan []netip.Prefix) bool {
	for _, r := range e.Ranges(a.Is4(), lan) {
		if !a.Less(r.First) && !r.Last.Less(a) {
			return r.Allow
		}
	}
	return false
}

// nameRefused counts and tells a connection the name check refused.
func (nw *Network) nameRefused(src, dst netip.AddrPort, name, why string) {
	nc := &nw.nameCheck
	nc.mu.Lock()
	if nc.refused == nil {
		nc.refused = map[netip.Addr]uint64{}
	}
	if _, ok := nc.refused[src.Addr()]; ok || len(nc.refused) < egressSources {
		nc.refused[src.Addr()]++
	}
	nc.total++
	nc.mu.Unlock()
	if nw.onEgressDenied == nil {
		return
	}
	flow := nettypes.DeniedFlow{Proto: "tcp", Src: src, Dst: dst, Name: name, Why: why, MAC: nw.macOf(src.Addr())}
	if name == "" && dst.IsValid() {
		flow.Name = nw.recent.name(src.Addr(), dst.Addr())
	}
	nw.tellDenied(flow)
}

// addRefused adds the name check's refusals by source to by.
func (nc *nameCheck) addRefused(by map[netip.Addr]uint64) {
	nc.mu.Lock()
	defer nc.mu.Unlock()
	for a, n := range nc.refused {
		by[a] += n
	}
}

// refusedTotal is how many connections the name check refused.
func (nc *nameCheck) refusedTotal() uint64 {
	nc.mu.Lock()
	defer nc.mu.Unlock()
	return nc.total
}
