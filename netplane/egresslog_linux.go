package netplane

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"net/netip"
	"sync"
	"time"

	"github.com/miekg/dns"
	vnl "github.com/vishvananda/netlink"

	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/nettypes"
)

// Denied flows: the chain that drops what an egress policy refuses
// copies a few of each source's packets a second (egressLogRate, per
// source: a flooding guest takes no other VM's share) to the network's
// NFLOG group, and the network tells OnEgressDenied of each, with the
// VM's MAC and the name the VM asked the DNS proxy for, if it did: at
// most one a VM every 10 s, with how many were left out (guestlog), so
// that a guest cannot grow the events' file without bound.
const (
	egressLog4     = "egress-log4"
	egressLog6     = "egress-log6"
	egressLogRate  = "1/second burst 5 packets"
	egressLogGroup = 0x1000 // and egressLogSpan after it, below the guard's learn groups
	egressLogSpan  = 0x4000
	// egressLogCopy is how much of a denied packet is read: an IPv6
	// header and a transport header's ports.
	egressLogCopy = 64
	// maxRecentNames bounds the answers remembered to name a denied flow.
	maxRecentNames = 4096
)

// EgressLogGroup is network id's NFLOG group for its denied flows.
func EgressLogGroup(id string) uint16 {
	h := fnv.New32a()
	h.Write([]byte("egress/" + id))
	return uint16(egressLogGroup + h.Sum32()%egressLogSpan)
}

// egressLogRules are the EgressDenied chain's rules that copy its
// packets to the network's NFLOG group, before the drop.
func egressLogRules(id string) []string {
	group := fmt.Sprintf(" log group %d", EgressLogGroup(id))
	return []string{
		"update @" + egressLog4 + " { ip saddr limit rate " + egressLogRate + " }" + group,
		"update @" + egressLog6 + " { ip6 saddr limit rate " + egressLogRate + " }" + group,
	}
}

// startEgressLog reads the network's denied flows, when someone is told
// of them. A group another socket holds leaves the network without the
// events, and says so.
func (nw *Network) startEgressLog() error {
	if nw.onEgressDenied == nil {
		return nil
	}
	var f *hostnet.NFLOG
	var bridge int
	err := nw.nsr.do(func() (err error) {
		br, err := vnl.LinkByName(nw.n.Bridge())
		if err != nil {
			return err
		}
		bridge = br.Attrs().Index
		f, err = hostnet.OpenNFLOG(EgressLogGroup(nw.n.ID), egressLogCopy)
		return err
	})
	if err != nil {
		nw.log.Warn("denied flows: not read; their counters still count", "nflogGroup", EgressLogGroup(nw.n.ID), "err", err)
		return nil
	}
	nw.closers = append(nw.closers, f.Close)
	nw.wg.Add(1)
	go func() {
		defer nw.wg.Done()
		for {
			pkts, err := f.Receive()
			if err != nil {
				select {
				case <-nw.stop:
					return
				default:
				}
				if hostnet.IsClosed(err) {
					return
				}
				continue // (ENOBUFS: a burst was lost)
			}
			for _, p := range pkts {
				if int(p.InDev) != bridge {
					continue // another network's whose group is the same (a hash)
				}
				flow, ok := deniedFlow(p.Payload)
				if !ok {
					continue
				}
				flow.MAC = nw.macOf(flow.Src.Addr())
				flow.Name = nw.recent.name(flow.Src.Addr(), flow.Dst.Addr())
				nw.tellDenied(flow)
			}
		}
	}()
	return nil
}

// tellDenied tells OnEgressDenied of flow, within the VM's share (the
// name check's refusals and the kernel's count alike).
func (nw *Network) tellDenied(flow nettypes.DeniedFlow) {
	key := flow.MAC // the VM, whatever source it uses
	if key == "" {
		key = flow.Src.Addr().String()
	}
	if ok, n := nw.deniedLog.Allow(key, time.Now()); ok {
		flow.Suppressed = n
		nw.onEgressDenied(nw.n.ID, flow)
	}
}

// deniedFlow reads an IP packet's addresses, protocol and ports.
func deniedFlow(b []byte) (nettypes.DeniedFlow, bool) {
	var f nettypes.DeniedFlow
	var proto byte
	var l4 []byte
	switch {
	case len(b) >= 20 && b[0]>>4 == 4:
		hl := int(b[0]&0x0f) * 4
		if hl < 20 || len(b) < hl {
			return f, false
		}
		src, _ := netip.AddrFromSlice(b[12:16])
		dst, _ := netip.AddrFromSlice(b[16:20])
		proto, l4 = b[9], b[hl:]
		f.Src, f.Dst = netip.AddrPortFrom(src, 0), netip.AddrPortFrom(dst, 0)
	case len(b) >= 40 && b[0]>>4 == 6:
		src, _ := netip.AddrFromSlice(b[8:24])
		dst, _ := netip.AddrFromSlice(b[24:40])
		proto, l4 = b[6], b[40:] // (an extension header leaves the ports out)
		f.Src, f.Dst = netip.AddrPortFrom(src, 0), netip.AddrPortFrom(dst, 0)
	default:
		return f, false
	}
	switch proto {
	case 6, 17:
		f.Proto = map[byte]string{6: "tcp", 17: "udp"}[proto]
		if len(l4) >= 4 {
			f.Src = netip.AddrPortFrom(f.Src.Addr(), binary.BigEndian.Uint16(l4[0:2]))
			f.Dst = netip.AddrPortFrom(f.Dst.Addr(), binary.BigEndian.Uint16(l4[2:4]))
		}
	case 1, 58:
		f.Proto = "icmp"
	default:
		f.Proto = fmt.Sprintf("proto %d", proto)
	}
	return f, true
}

// macOf is the MAC of the VM that has addr: its lease, or the IPv6
// address it claimed; "" for none.
func (nw *Network) macOf(addr netip.Addr) string {
	if nw.alloc != nil {
		if mac, ok := nw.alloc.MACOf(addr); ok {
			return mac
		}
	}
	if nw.guard6 != nil {
		if hw, ok := nw.guard6.Learner.Owner(addr); ok {
			return hw.String()
		}
	}
	return ""
}

// recentNames remembers, of the DNS proxy's latest answers, which name
// each client asked for that gave each address: a denied flow to that
// address is named by it.
type recentNames struct {
	mu    sync.Mutex
	names map[[2]netip.Addr]string
	order [][2]netip.Addr // oldest first, at most maxRecentNames
}

// add remembers that client's question for name was answered with rrs.
func (r *recentNames) add(client netip.Addr, name string, rrs []dns.RR) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.names == nil {
		r.names = map[[2]netip.Addr]string{}
	}
	for _, rr := range rrs {
		ip := answerAddr(rr)
		if !ip.IsValid() {
			continue
		}
		k := [2]netip.Addr{client, ip}
		if _, ok := r.names[k]; !ok {
			r.order = append(r.order, k)
		}
		r.names[k] = dns.Fqdn(name)[:len(dns.Fqdn(name))-1]
		if len(r.order) > maxRecentNames {
			delete(r.names, r.order[0])
			r.order = r.order[1:]
		}
	}
}

// name is the name client asked for that gave addr, "" if none.
func (r *recentNames) name(client, addr netip.Addr) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.names[[2]netip.Addr{client, addr}]
}
