package netplane

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/vmnetctl/vmnetctl/hostnet"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/vmnetctl/vmnetctl/nettypes"
)

// Port forwards, in the kernel: nftables DNAT in the network's inet table.
// Connections to a forwarded host port, arriving from outside
// (prerouting) or made by the host itself (output, which includes the
// host's loopback), are sent to the VM's current address: the rules are
// fixed (nftRules) and look the port up in two maps whose elements
// SetForwards keeps equal to the forwards and the VMs' addresses (a lease
// that changes moves the forward with it). A chain of one rule per
// forward counts the connections: NAT chains see the first packet of
// each. Loopback works because the bridge has route_localnet (packets
// from 127.0.0.1 may leave through it; postrouting masquerades them).

// addForwardObjects adds the maps and the counting chain to tx.
func addForwardObjects(tx *knftables.Transaction) {
	tx.Add(&knftables.Map{Name: ForwardsByAddr, Type: "ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service"})
	tx.Add(&knftables.Map{Name: ForwardsAny, Type: "inet_proto . inet_service : ipv4_addr . inet_service"})
	tx.Add(&knftables.Chain{Name: ForwardsChain})
}

// forwardState is what a network forwards, kept to apply again when the
// VMs' addresses change, and what it applied last.
type forwardState struct {
	mu       sync.Mutex
	forwards []nettypes.Forward
	applied  string                    // the last transaction's content, to skip one that changes nothing
	targets  map[forwardKey]netip.Addr // each host port's VM address, as applied
}

// forwardKey is a forwarded host port (hostIP is 0.0.0.0 for every
// address) and where it went.
type forwardKey struct {
	proto          string
	hostIP         netip.Addr
	hostPort, port int
}

// SetForwards makes the network forward what fs say, to the VMs'
// addresses now (a VM without one yet gets its forwards when it leases):
// one transaction that empties the maps and the counting chain and fills
// them again, unless that would change nothing.
func (nw *Network) SetForwards(ctx context.Context, fs []nettypes.Forward) error {
	if !nw.n.Routed() || nw.nsr == nil {
		return nil
	}
	nw.fwd.mu.Lock()
	defer nw.fwd.mu.Unlock()
	nw.fwd.forwards = slices.Clone(fs)
	return nw.applyForwards(ctx)
}

// refreshForwards applies the forwards again (a VM's address changed).
func (nw *Network) refreshForwards() {
	nw.fwd.mu.Lock()
	defer nw.fwd.mu.Unlock()
	if len(nw.fwd.forwards) == 0 && len(nw.fwd.targets) == 0 {
		return
	}
	if err := nw.applyForwards(context.Background()); err != nil {
		nw.log.Error("port forwards are not up to date", "err", err)
	}
}

// vmAddr is the VM's address on the network: its fixed one, else its lease.
func (nw *Network) vmAddr(mac string) (netip.Addr, bool) {
	hw, err := net.ParseMAC(mac)
	if err != nil || nw.alloc == nil {
		return netip.Addr{}, false
	}
	if ip, ok := nw.alloc.Fixed(hw); ok {
		return ip, true
	}
	if l, ok := nw.alloc.Lookup(hw); ok {
		return l.IP, true
	}
	return netip.Addr{}, false
}

func (nw *Network) applyForwards(ctx context.Context) error {
	nft, err := hostnet.NFT(knftables.InetFamily, nw.n.ID)
	if err != nil {
		return err
	}
	tx := nft.NewTransaction()
	addForwardObjects(tx)
	tx.Flush(&knftables.Map{Name: ForwardsByAddr})
	tx.Flush(&knftables.Map{Name: ForwardsAny})
	tx.Flush(&knftables.Chain{Name: ForwardsChain})
	var sig strings.Builder
	counters := map[string]bool{}
	targets := map[forwardKey]netip.Addr{}
	for _, f := range nw.fwd.forwards {
		pf := f.PortForward
		match := fmt.Sprintf("meta l4proto %s th dport %s", pf.Proto, pf.HostPort)
		if !pf.HostIP.IsUnspecified() {
			match = "ip daddr " + pf.HostIP.String() + " " + match
		}
		name := nettypes.ForwardKey(f.Key, pf)
		counters[name] = true
		tx.Add(&knftables.Counter{Name: name})
		tx.Add(&knftables.Rule{Chain: ForwardsChain, Rule: match + " counter name " + fmt.Sprintf("%q", name)})
		ip, ok := nw.vmAddr(f.MAC)
		fmt.Fprintf(&sig, "%s %s %v;", name, ip, ok)
		if !ok {
			continue
		}
		for i := range pf.HostPort.Len() {
			targets[forwardKey{pf.Proto, pf.HostIP, pf.HostPort.First + i, pf.GuestPort.First + i}] = ip
			to := []string{ip.String(), fmt.Sprint(pf.GuestPort.First + i)}
			port := fmt.Sprint(pf.HostPort.First + i)
			if pf.HostIP.IsUnspecified() {
				tx.Add(&knftables.Element{Map: ForwardsAny, Key: []string{pf.Proto, port}, Value: to})
			} else {
				tx.Add(&knftables.Element{Map: ForwardsByAddr, Key: []string{pf.HostIP.String(), pf.Proto, port}, Value: to})
			}
		}
	}
	if sig.String() == nw.fwd.applied && nw.fwd.targets != nil {
		return nil
	}
	err = nw.nsr.do(func() error {
		// The counters of forwards that are gone go with them.
		old, err := namedCounters(ctx, knftables.InetFamily, nw.n.ID, nettypes.ForwardKeyPrefix)
		if err != nil {
			return err
		}
		for name := range old {
			if !counters[name] {
				tx.Delete(&knftables.Counter{Name: name})
			}
		}
		if err := nft.Run(ctx, tx); err != nil {
			return err
		}
		// Connections through a forward that is gone or moved are
		// forgotten: conntrack would keep sending them to the old VM.
		for k, ip := range nw.fwd.targets {
			if now, ok := targets[k]; !ok || now != ip {
				forgetForwarded(k, ip)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("network %q: port forwards: %w", nw.n.ID, err)
	}
	nw.fwd.applied, nw.fwd.targets = sig.String(), targets
	return nil
}

// forgetForwarded deletes the conntrack entries of connections forwarded
// through k to ip, in the calling thread's namespace.
func forgetForwarded(k forwardKey, ip netip.Addr) {
	f := &netlink.ConntrackFilter{}
	proto := uint8(unix.IPPROTO_TCP)
	if k.proto == "udp" {
		proto = unix.IPPROTO_UDP
	}
	if f.AddProtocol(proto) != nil || f.AddIP(netlink.ConntrackReplySrcIP, net.IP(ip.AsSlice())) != nil ||
		f.AddPort(netlink.ConntrackOrigDstPort, uint16(k.hostPort)) != nil {
		return
	}
	netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, f)
}

// forwardConns returns the connections each forward took, by ForwardKey.
func forwardConns(ctx context.Context, id string) (map[string]uint64, error) {
	return namedCounters(ctx, knftables.InetFamily, id, nettypes.ForwardKeyPrefix)
}
