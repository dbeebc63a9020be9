package netplane

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"

	"github.com/vmnetctl/vmnetctl/backend"
	"sigs.k8s.io/knftables"
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
// VMs' addresses change.
type forwardState struct {
	mu       sync.Mutex
	forwards []backend.Forward
}

// SetForwards makes the network forward what fs say, to the VMs'
// addresses now (a VM without one yet gets its forwards when it leases):
// one transaction that empties the maps and the counting chain and fills
// them again.
func (nw *Network) SetForwards(ctx context.Context, fs []backend.Forward) error {
	if !nw.n.Routed() || nw.inNS == nil {
		return nil
	}
	nw.fwd.mu.Lock()
	defer nw.fwd.mu.Unlock()
	nw.fwd.forwards = slices.Clone(fs)
	return nw.applyForwards(ctx)
}

// refreshForwards applies the forwards again (a lease changed).
func (nw *Network) refreshForwards() {
	nw.fwd.mu.Lock()
	defer nw.fwd.mu.Unlock()
	if len(nw.fwd.forwards) == 0 {
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
	nft, err := newNFT(knftables.InetFamily, nw.n.ID)
	if err != nil {
		return err
	}
	tx := nft.NewTransaction()
	addForwardObjects(tx)
	tx.Flush(&knftables.Map{Name: ForwardsByAddr})
	tx.Flush(&knftables.Map{Name: ForwardsAny})
	tx.Flush(&knftables.Chain{Name: ForwardsChain})
	for _, f := range nw.fwd.forwards {
		pf := f.PortForward
		match := fmt.Sprintf("meta l4proto %s th dport %s", pf.Proto, pf.HostPort)
		if !pf.HostIP.IsUnspecified() {
			match = "ip daddr " + pf.HostIP.String() + " " + match
		}
		tx.Add(&knftables.Counter{Name: ForwardKey(f.Key, f.Index)})
		tx.Add(&knftables.Rule{Chain: ForwardsChain, Rule: match + " counter name " + fmt.Sprintf("%q", ForwardKey(f.Key, f.Index))})
		ip, ok := nw.vmAddr(f.MAC)
		if !ok {
			continue
		}
		for i := range pf.HostPort.Len() {
			to := []string{ip.String(), fmt.Sprint(pf.GuestPort.First + i)}
			port := fmt.Sprint(pf.HostPort.First + i)
			if pf.HostIP.IsUnspecified() {
				tx.Add(&knftables.Element{Map: ForwardsAny, Key: []string{pf.Proto, port}, Value: to})
			} else {
				tx.Add(&knftables.Element{Map: ForwardsByAddr, Key: []string{pf.HostIP.String(), pf.Proto, port}, Value: to})
			}
		}
	}
	if err := nw.inNS(func() error { return nft.Run(ctx, tx) }); err != nil {
		return fmt.Errorf("network %q: port forwards: %w", nw.n.ID, err)
	}
	return nil
}

// forwardConns returns the connections each forward took, by ForwardKey.
func forwardConns(ctx context.Context, id string) (map[string]uint64, error) {
	conns, err := namedCounters(ctx, knftables.InetFamily, id, "fwd-")
	out := map[string]uint64{}
	for k, v := range conns {
		out["fwd-"+k] = v
	}
	return out, err
}
