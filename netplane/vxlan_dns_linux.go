package netplane

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/miekg/dns"

	"github.com/vmnetctl/vmnetctl/dnsproxy"
	"github.com/vmnetctl/vmnetctl/overlay"
)

// Names across hosts: each host's DNS proxy knows its own VMs (VM files and
// DHCP host names). For a name it does not know as a VM file's, the proxy
// of a network across hosts asks the other hosts, over the underlay, on
// vxlan.dnsPort of their underlay addresses: a small DNS server there
// answers A and AAAA for its own VMs' names only (never forwarding, never
// asking further), and only to the segment's hosts. As on one host, a VM
// file's name wins over a DHCP host name, whichever host has each: the
// answers say which they are (authoritative for a VM file's name).

// peerTimeout bounds the wait for the other hosts' answers.
const peerTimeout = 500 * time.Millisecond

// maxPeerHandlers bounds the queries a host's name service answers at once.
const maxPeerHandlers = 16

// peerZone is the suffix of the names hosts ask each other for: NAME.VNI.
// and this, so that networks sharing one listener are told apart.
const peerZone = "peers." + dnsproxy.Domain + "."

// peerQName is the question a host asks its peers for name on segment vni.
func peerQName(name string, vni uint32) string {
	return name + "." + strconv.FormatUint(uint64(vni), 10) + "." + peerZone
}

// parsePeerQName is peerQName undone.
func parsePeerQName(q string) (name string, vni uint32, ok bool) {
	rest, found := strings.CutSuffix(dnsproxy.LowerASCII(q), "."+peerZone)
	if !found {
		return "", 0, false
	}
	name, v, found := strings.Cut(rest, ".")
	n, err := strconv.ParseUint(v, 10, 32)
	if !found || err != nil || !dnsproxy.ValidHostName(name) {
		return "", 0, false
	}
	return name, uint32(n), true
}

// peerListener is one name service for the other hosts: a socket on an
// underlay address and dnsPort, shared by the networks across hosts that
// have the same (in one network namespace), each found by its VNI.
type peerListener struct {
	srv  *dnsproxy.UDPServer
	done chan struct{}
	nets map[uint32]*peerNames
}

// peerListeners are this process's, by network namespace and address.
var peerListeners = struct {
	sync.Mutex
	m map[string]*peerListener
}{m: map[string]*peerListener{}}

// startPeerDNS serves the network's own names to the other hosts of its
// segment, and makes the proxy ask them for names it does not know.
func (nw *Network) startPeerDNS() error {
	idx, _, err := overlay.LocalHost(nw.n)
	if err != nil {
		return err
	}
	x := nw.n.VXLAN
	local := x.TunnelAddr(idx) // with WireGuard, inside it
	var peers []netip.Addr
	for i := range x.Hosts {
		if i != idx {
			peers = append(peers, x.TunnelAddr(i))
		}
	}
	addr := netip.AddrPortFrom(local, x.DNSPort)
	key := addr.String()
	if st, err := os.Stat(nw.nsr.netns.Path()); err == nil {
		key = fmt.Sprintf("%d/%s", st.Sys().(*syscall.Stat_t).Ino, addr)
	}
	names := &peerNames{h: nw.dns, peers: peers}
	peerListeners.Lock()
	defer peerListeners.Unlock()
	l := peerListeners.m[key]
	if l == nil {
		conn, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(addr))
		if err != nil {
			return fmt.Errorf("network %q: serving names to the other hosts on %s: %w", nw.n.ID, addr, err)
		}
		l = &peerListener{done: make(chan struct{}), nets: map[uint32]*peerNames{}}
		l.srv = dnsproxy.NewUDPServer(conn, l, maxPeerHandlers, nil, l.isPeer)
		go func() {
			defer close(l.done)
			l.srv.Serve()
		}()
		peerListeners.m[key] = l
	}
	if _, taken := l.nets[x.VNI]; taken {
		return fmt.Errorf("network %q: VNI %d is served on %s already", nw.n.ID, x.VNI, addr)
	}
	l.nets[x.VNI] = names
	nw.closers = append(nw.closers, func() error {
		peerListeners.Lock()
		delete(l.nets, x.VNI)
		last := len(l.nets) == 0
		if last {
			delete(peerListeners.m, key)
			l.srv.Close() // the port is free for a listener made after
		}
		peerListeners.Unlock()
		// Waited for without the lock, which the server's loop (isPeer)
		// and its handlers (ServeDNS) take until they end.
		if last {
			<-l.done
		}
		return nil
	})
	nw.dns.Remote = func(name string) (dnsproxy.PeerAnswer, bool) {
		return askPeers(nw.dns, name, x.VNI, peers, x.DNSPort)
	}
	return nil
}

// isPeer says whether a is a host of one of the segments l serves: the
// only ones it answers (peerNames.answer), and the only ones whose
// questions take a handler.
func (l *peerListener) isPeer(a netip.Addr) bool {
	peerListeners.Lock()
	defer peerListeners.Unlock()
	for _, pn := range l.nets {
		if slices.Contains(pn.peers, a) {
			return true
		}
	}
	return false
}

// ServeDNS hands a question to the network it names by its VNI.
func (l *peerListener) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	if len(r.Question) != 1 {
		return
	}
	name, vni, ok := parsePeerQName(r.Question[0].Name)
	peerListeners.Lock()
	p := l.nets[vni]
	peerListeners.Unlock()
	if ok && p != nil {
		p.answer(w, r, name)
	}
}

// peerNames answers the segment's other hosts: this host's VMs' names.
type peerNames struct {
	h     *dnsproxy.Proxy
	peers []netip.Addr
}

// answer answers a host of the segment (and no one else) for name.
func (p *peerNames) answer(w dns.ResponseWriter, r *dns.Msg, name string) {
	from, ok := netip.AddrFromSlice(w.RemoteAddr().(*net.UDPAddr).IP.To4())
	if !ok || !slices.Contains(p.peers, from) {
		return // not a host of the segment: no answer at all
	}
	m := new(dns.Msg)
	m.SetReply(r)
	ip, found := p.h.Resolve(name)
	var ip6 []netip.Addr
	if p.h.Resolve6 != nil {
		ip6 = p.h.Resolve6(name)
	}
	if !found && len(ip6) == 0 {
		m.SetRcode(r, dns.RcodeNameError)
		w.WriteMsg(m)
		return
	}
	// Authoritative: a VM file's name here, which wins over a DHCP host
	// name anywhere.
	m.Authoritative = p.h.FileName != nil && p.h.FileName(name)
	m.Answer = dnsproxy.AddressRRs(r.Question[0].Name, ip, ip6)
	w.WriteMsg(m)
}

// peerAnswer is a peer's answer and the peer's place among the peers.
type peerAnswer struct {
	dnsproxy.PeerAnswer
	host int
}

// askPeers asks every peer at once for name's addresses on segment vni
// and returns the best answer: a VM file's name at once, else, once every
// peer answered or the time is up, the DHCP host name of the first peer
// in the segment's order that has it. Every query has ended when it
// returns (their sockets closed), and the proxy's bound on forwarded
// queries bounds them: with every slot taken, the name is not looked for.
func askPeers(h *dnsproxy.Proxy, name string, vni uint32, peers []netip.Addr, port uint16) (dnsproxy.PeerAnswer, bool) {
	release, ok := h.Slot()
	if !ok {
		return dnsproxy.PeerAnswer{}, false
	}
	defer release()
	ctx, cancel := context.WithTimeout(context.Background(), peerTimeout)
	defer cancel()
	answers := make(chan peerAnswer, len(peers))
	var wg sync.WaitGroup
	for i, p := range peers {
		wg.Go(func() {
			if a, ok := askPeer(ctx, h.Dial, name, vni, netip.AddrPortFrom(p, port)); ok {
				answers <- peerAnswer{a, i}
			}
		})
	}
	go func() { wg.Wait(); close(answers) }()
	var best peerAnswer
	found := false
	for a := range answers {
		if a.ByFile {
			cancel() // the others end at once (their reads' deadline)
			best, found = a, true
			break
		}
		if !found || a.host < best.host {
			best, found = a, true
		}
	}
	cancel()
	wg.Wait()
	return best.PeerAnswer, found
}

// askPeer asks one peer for name.
func askPeer(ctx context.Context, dial func(context.Context, string, string) (net.Conn, error), name string, vni uint32, peer netip.AddrPort) (dnsproxy.PeerAnswer, bool) {
	var a dnsproxy.PeerAnswer
	c, err := dial(ctx, "udp", peer.String())
	if err != nil {
		return a, false
	}
	defer c.Close()
	deadline, _ := ctx.Deadline()
	c.SetDeadline(deadline)
	// Cancelled (another peer answered with a VM file's name): end now.
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	co := &dns.Conn{Conn: c}
	q := new(dns.Msg)
	q.SetQuestion(peerQName(name, vni), dns.TypeANY)
	if err := co.WriteMsg(q); err != nil {
		return a, false
	}
	resp, err := co.ReadMsg()
	if err != nil || resp.Id != q.Id || resp.Rcode != dns.RcodeSuccess {
		return a, false
	}
	a.ByFile = resp.Authoritative
	for _, rr := range resp.Answer {
		switch rr := rr.(type) {
		case *dns.A:
			a.IP, _ = netip.AddrFromSlice(rr.A.To4())
		case *dns.AAAA:
			if v, ok := netip.AddrFromSlice(rr.AAAA); ok {
				a.IP6 = append(a.IP6, v)
			}
		}
	}
	return a, a.IP.IsValid() || len(a.IP6) > 0
}
