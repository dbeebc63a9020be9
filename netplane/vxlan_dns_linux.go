package netplane

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/miekg/dns"

	"github.com/vmnetctl/vmnetctl/backend"
)

// Names across hosts: each host's DNS proxy knows its own VMs (VM files and
// DHCP host names). For a name it does not know, the proxy of a network
// across hosts asks the other hosts' proxies, over the underlay, on
// vxlan.dnsPort of their underlay addresses: a small DNS server there
// answers A and AAAA for its own VMs' names only (never forwarding, never
// asking further), and only to the segment's hosts.

// peerTimeout bounds the wait for the other hosts' answers.
const peerTimeout = 500 * time.Millisecond

// startPeerDNS serves the network's own names to the other hosts of its
// segment, and makes the proxy ask them for names it does not know.
func (nw *Network) startPeerDNS() error {
	idx, local, err := localVXLANHost(nw.n)
	if err != nil {
		return err
	}
	x := nw.n.VXLAN
	var peers []netip.Addr
	for i, h := range x.Hosts {
		if i != idx {
			peers = append(peers, h.Address)
		}
	}
	addr := net.JoinHostPort(local.String(), strconv.Itoa(int(x.DNSPort)))
	pc, err := net.ListenPacket("udp4", addr)
	if err != nil {
		return fmt.Errorf("network %q: serving names to the other hosts on %s: %w", nw.n.ID, addr, err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: &peerNames{h: nw.dns, peers: peers}}
	nw.wg.Add(1)
	go func() {
		defer nw.wg.Done()
		if err := srv.ActivateAndServe(); err != nil && !nw.stopped() {
			nw.fail(fmt.Errorf("network %q: the name server for the other hosts stopped: %w", nw.n.ID, err))
		}
	}()
	nw.closers = append(nw.closers, srv.Shutdown)
	nw.dns.remote = func(name string) (netip.Addr, []netip.Addr, bool) {
		return nw.dns.askPeers(name, peers, x.DNSPort)
	}
	return nil
}

// peerNames answers the segment's other hosts: this host's VMs' names.
type peerNames struct {
	h     *dnsHandler
	peers []netip.Addr
}

func (p *peerNames) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	from, ok := netip.AddrFromSlice(w.RemoteAddr().(*net.UDPAddr).IP.To4())
	if !ok || !slices.Contains(p.peers, from) || len(r.Question) != 1 {
		return // not a host of the segment: no answer at all
	}
	q := r.Question[0]
	m := new(dns.Msg)
	m.SetReply(r)
	m.Authoritative = true
	name, inZone, ok := localName(q.Name)
	if !inZone || !ok {
		m.SetRcode(r, dns.RcodeRefused)
		w.WriteMsg(m)
		return
	}
	ip, found := p.h.resolve(name)
	var ip6 []netip.Addr
	if p.h.resolve6 != nil {
		ip6 = p.h.resolve6(name)
	}
	if !found && len(ip6) == 0 {
		m.SetRcode(r, dns.RcodeNameError)
		w.WriteMsg(m)
		return
	}
	m.Answer = addressRRs(q.Name, ip, ip6)
	w.WriteMsg(m)
}

// addressRRs are the A record of ip (if valid) and the AAAA records of ip6.
func addressRRs(qname string, ip netip.Addr, ip6 []netip.Addr) []dns.RR {
	var rrs []dns.RR
	if ip.IsValid() {
		rrs = append(rrs, &dns.A{Hdr: dns.RR_Header{Name: qname, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: localTTL}, A: net.IP(ip.AsSlice())})
	}
	for _, a := range ip6 {
		rrs = append(rrs, &dns.AAAA{Hdr: dns.RR_Header{Name: qname, Rrtype: dns.TypeAAAA, Class: dns.ClassINET, Ttl: localTTL}, AAAA: net.IP(a.AsSlice())})
	}
	return rrs
}

// askPeers asks every peer at once for name's addresses (one ANY query
// each) and returns the first that knows it. The proxy's bound on
// forwarded queries bounds these too: with every slot taken, the name is
// not looked for.
func (h *dnsHandler) askPeers(name string, peers []netip.Addr, port uint16) (netip.Addr, []netip.Addr, bool) {
	h.init()
	select {
	case h.inFlight <- struct{}{}:
	default:
		h.count(func(s *backend.DNSStats) { s.Dropped++ })
		return netip.Addr{}, nil, false
	}
	defer func() { <-h.inFlight }()
	found := make(chan peerAnswer, len(peers))
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), peerTimeout)
	defer cancel()
	for _, p := range peers {
		wg.Go(func() {
			if a, ok := h.askPeer(ctx, name, netip.AddrPortFrom(p, port)); ok {
				found <- a
			}
		})
	}
	go func() { wg.Wait(); close(found) }()
	for a := range found {
		cancel()
		return a.ip, a.ip6, true
	}
	return netip.Addr{}, nil, false
}

// peerAnswer is what a peer knows of a name.
type peerAnswer struct {
	ip  netip.Addr
	ip6 []netip.Addr
}

// askPeer asks one peer for name.
func (h *dnsHandler) askPeer(ctx context.Context, name string, peer netip.AddrPort) (peerAnswer, bool) {
	var a peerAnswer
	c, err := h.dial(ctx, "udp", peer.String())
	if err != nil {
		return a, false
	}
	defer c.Close()
	deadline, _ := ctx.Deadline()
	c.SetDeadline(deadline)
	co := &dns.Conn{Conn: c}
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name+"."+DNSDomain), dns.TypeANY)
	if err := co.WriteMsg(q); err != nil {
		return a, false
	}
	resp, err := co.ReadMsg()
	if err != nil || resp.Id != q.Id || resp.Rcode != dns.RcodeSuccess {
		return a, false
	}
	for _, rr := range resp.Answer {
		switch rr := rr.(type) {
		case *dns.A:
			a.ip, _ = netip.AddrFromSlice(rr.A.To4())
		case *dns.AAAA:
			if v, ok := netip.AddrFromSlice(rr.AAAA); ok {
				a.ip6 = append(a.ip6, v)
			}
		}
	}
	return a, a.ip.IsValid() || len(a.ip6) > 0
}
