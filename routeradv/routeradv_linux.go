// Package routeradv sends a network's router advertisements (RFC 4861,
// RFC 8106): the prefix for SLAAC, the default router, the MTU and the
// DNS servers, periodically and in answer to solicitations, rate-limited.
package routeradv

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mdlayher/ndp"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/rtlink"
)

// A network's bridge advertises its IPv6 prefix with router advertisements
// (RFC 4861), so that guests configure themselves (SLAAC) with no DHCPv6:
// an address in the prefix, the bridge as default router (shared networks),
// the MTU and the DNS servers and search domains (RFC 8106).
//
// The RAs go to all-nodes (ff02::1), both the unsolicited ones and the
// replies to router solicitations (RFC 4861 6.2.6 allows either): one
// multicast reply answers every guest that solicited in the same moment, so
// the replies can be rate-limited in total without leaving a guest
// unanswered. A solicitation that arrives within raReplyInterval of the
// last reply is folded into the next one, sent when the interval is over:
// a guest flooding solicitations gets at most one RA a second sent on the
// network, and costs the host one cheap read per packet.

const (
	// raInitialCount RAs are sent at start, raInitialInterval to twice
	// that apart, so that a VM that boots with the network is served at
	// once (RFC 4861 6.2.4 allows a few at shorter intervals). The first
	// goes out immediately.
	raInitialCount    = 3
	raInitialInterval = 2 * time.Second
	// Then one every raMinInterval to raMaxInterval, at random (RFC 4861
	// 6.2.4: jitter keeps routers from synchronising).
	raMinInterval = 2 * time.Minute
	raMaxInterval = 3 * time.Minute
	// raReplyInterval is the least time between two replies to router
	// solicitations, whoever sent them.
	raReplyInterval = time.Second
	// raDNSLifetime is how long guests keep the RDNSS and DNSSL options:
	// 3 × raMaxInterval, as RFC 8106 5.1 advises, so that losing an RA or
	// two does not make them forget.
	raDNSLifetime = 3 * raMaxInterval
	// The prefix's lifetimes (radvd's defaults): a guest's address stays
	// preferred for 4 hours and valid for a day after the last RA, so an
	// address outlives a stopped vmnetctl by far.
	ValidLifetime       = 24 * time.Hour
	raPreferredLifetime = 4 * time.Hour
	// raMaxRouterLifetime is the most RFC 4861 4.2 allows.
	raMaxRouterLifetime = 9000 * time.Second
	// raLinkLocalWait bounds the wait for the interface's link-local
	// address at start; raPoll is how often it looks.
	raLinkLocalWait = 5 * time.Second
	raPoll          = 50 * time.Millisecond
	// raRetry is how long the reader waits after a failed read (the
	// interface is down) before it reads again.
	raRetry = time.Second
	// raWriteTimeout bounds one send, so that Close cannot hang on one.
	raWriteTimeout = time.Second
)

// allNodes and allRouters are the link-local multicast groups RAs go to
// and solicitations come to.
var (
	allNodes   = netip.MustParseAddr("ff02::1")
	allRouters = netip.MustParseAddr("ff02::2")
)

// Config is what a network's router advertisements say.
type Config struct {
	Iface          string        // the interface to advertise on (the network's bridge)
	Prefix         netip.Prefix  // a /64: on-link and autonomous (SLAAC)
	RouterLifetime time.Duration // 0: not a default router (host-only networks); shared networks use e.g. 30 min
	MTU            int           // advertised MTU option (0: none)
	RDNSS          []netip.Addr  // DNS servers option (RFC 8106), lifetime raDNSLifetime
	DNSSL          []string      // search domains option (RFC 8106), e.g. "vmnet.internal"
}

// Server sends router advertisements on one interface: a sender
// goroutine sends the periodic ones and the replies, a reader goroutine
// reads the solicitations and asks the sender for a reply.
type Server struct {
	log  *slog.Logger
	conn *socket
	addr netip.Addr // the link-local address the RAs come from

	ra []byte // the RA sent, marshalled

	// solicit holds one pending reply: a solicitation that finds it full
	// is answered by the reply already pending.
	solicit chan struct{}

	stop       chan struct{}
	senderDone chan struct{}
	readerDone chan struct{}
	closeOnce  sync.Once
	closeErr   error

	sent, replies, solicited, limited atomic.Uint64
	ignored                           atomic.Uint64 // what was read and not a valid solicitation
}

// Start starts advertising cfg on cfg.Iface: raInitialCount unsolicited
// RAs to all-nodes at start, raInitialInterval to twice that apart, then
// one every raMinInterval to raMaxInterval, and a reply to router
// solicitations, at most one per raReplyInterval in all. Close stops it.
//
// It needs a usable (not tentative) link-local address on the interface,
// and waits raLinkLocalWait for one: an interface that has just come up is
// still doing DAD, and a bridge without ports may have no carrier, so its
// DAD never ends unless accept_dad is 0 on it. The interface also needs
// accept_ra 0, as any router's: the RAs sent loop back to the host, which
// would otherwise give the interface an address in the prefix and the MTU
// when forwarding is off on it (Start logs a warning then).
//
// Call it in the network namespace of the interface: the socket stays in it.
func Start(cfg Config, log *slog.Logger) (*Server, error) {
	if log == nil {
		log = slog.Default()
	}
	log = log.With("iface", cfg.Iface)
	if err := cfg.check(); err != nil {
		return nil, fmt.Errorf("router advertisements on %s: %w", cfg.Iface, err)
	}
	conn, mac, addr, err := listenNDP(cfg.Iface, raLinkLocalWait)
	if err != nil {
		return nil, fmt.Errorf("router advertisements on %s: %w", cfg.Iface, err)
	}
	s := &Server{
		log: log, conn: conn, addr: addr,
		solicit:    make(chan struct{}, 1),
		stop:       make(chan struct{}),
		senderDone: make(chan struct{}),
		readerDone: make(chan struct{}),
	}
	// Marshalled once, so that a bad option (a DNSSL name) fails here
	// and not at every send.
	if s.ra, err = ndp.MarshalMessage(cfg.advertisement(mac)); err != nil {
		conn.Close()
		return nil, fmt.Errorf("router advertisements on %s: %w", cfg.Iface, err)
	}
	if takesOwnRAs(cfg.Iface) {
		log.Warn("the host configures itself from the router advertisements it sends: set net.ipv6.conf." + cfg.Iface + ".accept_ra to 0")
	}
	go s.sendLoop()
	go s.readLoop()
	log.Debug("sending router advertisements", "prefix", cfg.Prefix, "from", addr)
	return s, nil
}

// check rejects what the RA cannot carry or guests would ignore.
func (c *Config) check() error {
	switch {
	case !c.Prefix.IsValid() || !c.Prefix.Addr().Is6() || c.Prefix.Addr().Is4In6():
		return fmt.Errorf("prefix %s is not an IPv6 prefix", c.Prefix)
	case c.Prefix.Bits() != 64:
		return fmt.Errorf("prefix %s is not a /64, which SLAAC needs", c.Prefix)
	case c.RouterLifetime < 0 || c.RouterLifetime > raMaxRouterLifetime:
		return fmt.Errorf("router lifetime %v is not within 0-%v", c.RouterLifetime, raMaxRouterLifetime)
	case c.RouterLifetime > 0 && c.RouterLifetime < raMaxInterval:
		// RFC 4861 6.2.1: else guests lose the route between two RAs.
		return fmt.Errorf("router lifetime %v is shorter than the RA interval %v", c.RouterLifetime, raMaxInterval)
	case c.MTU != 0 && (c.MTU < 1280 || c.MTU > 65535):
		return fmt.Errorf("MTU %d is not within 1280-65535", c.MTU)
	}
	for _, a := range c.RDNSS {
		if !a.Is6() || a.Is4In6() {
			return fmt.Errorf("DNS server %s is not an IPv6 address", a)
		}
	}
	return nil
}

// advertisement is the RA for c, from the interface with MAC mac.
func (c *Config) advertisement(mac net.HardwareAddr) *ndp.RouterAdvertisement {
	ra := &ndp.RouterAdvertisement{
		RouterLifetime: c.RouterLifetime,
		Options: []ndp.Option{
			&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: mac},
			&ndp.PrefixInformation{
				PrefixLength:                   uint8(c.Prefix.Bits()),
				OnLink:                         true,
				AutonomousAddressConfiguration: true,
				ValidLifetime:                  ValidLifetime,
				PreferredLifetime:              raPreferredLifetime,
				Prefix:                         c.Prefix.Masked().Addr(),
			},
		},
	}
	if c.MTU != 0 {
		ra.Options = append(ra.Options, ndp.NewMTU(uint32(c.MTU)))
	}
	if len(c.RDNSS) > 0 {
		ra.Options = append(ra.Options, &ndp.RecursiveDNSServer{Lifetime: raDNSLifetime, Servers: slices.Clone(c.RDNSS)})
	}
	if len(c.DNSSL) > 0 {
		ra.Options = append(ra.Options, &ndp.DNSSearchList{Lifetime: raDNSLifetime, DomainNames: slices.Clone(c.DNSSL)})
	}
	return ra
}

// listenNDP opens the server's socket on the link-local address of
// iface, waiting up to wait for the address to be usable; it returns the
// socket, iface's MAC and the address.
func listenNDP(iface string, wait time.Duration) (*socket, net.HardwareAddr, netip.Addr, error) {
	deadline := time.Now().Add(wait)
	for {
		index, mac, addr, err := linkLocal(iface)
		if err == nil {
			var c *socket
			if c, err = listen(index, addr); err == nil {
				return c, mac, addr, nil
			}
		}
		if time.Now().After(deadline) {
			return nil, nil, netip.Addr{}, fmt.Errorf("no usable link-local address after %v (%s): %w", wait, linkLocalState(iface), err)
		}
		time.Sleep(raPoll) // a poll interval, bounded by deadline
	}
}

// linkLocalState says why iface has no usable link-local address, for an
// error message.
func linkLocalState(iface string) string {
	l, err := netlink.LinkByName(iface)
	if err != nil {
		return "the interface is missing"
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		return "the interface is down"
	}
	addrs, err := rtlink.Addrs(l.Attrs().Index, unix.AF_INET6)
	if err != nil {
		return err.Error()
	}
	lowerUp := l.Attrs().RawFlags&unix.IFF_LOWER_UP != 0
	for _, a := range addrs {
		ip := a.Prefix.Addr()
		if !ip.IsLinkLocalUnicast() {
			continue
		}
		switch {
		case a.Flags&unix.IFA_F_DADFAILED != 0:
			return fmt.Sprintf("%s failed duplicate address detection", ip)
		case a.Flags&unix.IFA_F_TENTATIVE != 0:
			return fmt.Sprintf("%s is tentative: DAD does not end without carrier, set accept_dad to 0 on %s", ip, iface)
		}
	}
	if !lowerUp {
		return "the interface has no carrier: the kernel adds its link-local address with the first"
	}
	return "none on the interface: IPv6 disabled, or addr_gen_mode none?"
}

// takesOwnRAs reports whether the kernel would take the RAs sent on iface,
// which loop back to it: accept_ra is 2, or 1 with forwarding off. It then
// adds an address in the prefix to iface and takes the MTU.
func takesOwnRAs(iface string) bool {
	read := func(key string) string {
		b, _ := os.ReadFile("/proc/sys/net/ipv6/conf/" + iface + "/" + key)
		return string(bytes.TrimSpace(b))
	}
	acceptRA := read("accept_ra")
	return acceptRA == "2" || acceptRA == "1" && read("forwarding") == "0"
}

// sendLoop sends the periodic RAs and the replies until stop.
func (s *Server) sendLoop() {
	defer close(s.senderDone)
	next := time.NewTimer(0)
	defer next.Stop()
	initial := raInitialCount
	var lastReply time.Time
	for {
		select {
		case <-s.stop:
			return
		case <-next.C:
			s.send(s.ra)
			initial--
			next.Reset(s.interval(initial > 0))
		case <-s.solicit:
			if !s.wait(time.Until(lastReply.Add(raReplyInterval))) {
				return
			}
			s.send(s.ra)
			s.replies.Add(1)
			lastReply = time.Now()
		}
	}
}

// interval is the random time to the next unsolicited RA.
func (s *Server) interval(initial bool) time.Duration {
	if initial {
		return raInitialInterval + rand.N(raInitialInterval)
	}
	return raMinInterval + rand.N(raMaxInterval-raMinInterval)
}

// wait waits d, and reports false if stop came first.
func (s *Server) wait(d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-s.stop:
		return false
	case <-t.C:
		return true
	}
}

// send sends ra to all-nodes. A failure is not fatal: while the bridge has
// no carrier or is down, sends fail, and the next RA goes out once it is up.
func (s *Server) send(ra []byte) {
	if err := s.conn.sendTo(ra, allNodes, raWriteTimeout); err != nil {
		s.log.Debug("router advertisement not sent", "err", err)
		return
	}
	s.sent.Add(1)
}

// readLoop reads router solicitations until the socket is closed, and asks
// sendLoop for a reply to each valid one, unless one is pending already.
func (s *Server) readLoop() {
	defer close(s.readerDone)
	buf := make([]byte, 1500)
	for {
		n, hops, src, err := s.conn.read(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) || s.stopped() {
				return
			}
			s.log.Debug("reading router solicitations", "err", err)
			if !s.wait(raRetry) {
				return
			}
			continue
		}
		if !validRS(buf[:n], hops, src) {
			s.ignored.Add(1)
			continue
		}
		s.solicited.Add(1)
		select {
		case s.solicit <- struct{}{}:
		default:
			s.limited.Add(1)
		}
	}
}

// validRS reports whether b, received from src with hop limit hops, is a
// router solicitation a router must answer (RFC 4861 6.1.1): hop limit
// 255 (it was not forwarded from off the link), code 0, and no link-layer
// address from the unspecified address.
func validRS(b []byte, hops int, src netip.Addr) bool {
	if hops != ndp.HopLimit || len(b) < 8 || b[1] != 0 {
		return false
	}
	m, err := ndp.ParseMessage(b)
	if err != nil {
		return false
	}
	rs, ok := m.(*ndp.RouterSolicitation)
	if !ok {
		return false
	}
	if src.WithZone("").IsUnspecified() {
		for _, o := range rs.Options {
			if lla, ok := o.(*ndp.LinkLayerAddress); ok && lla.Direction == ndp.Source {
				return false
			}
		}
	}
	return true
}

func (s *Server) stopped() bool {
	select {
	case <-s.stop:
		return true
	default:
		return false
	}
}

// Close stops the server and waits for its goroutines. It sends no final
// advertisement withdrawing the router (RFC 4861 6.2.5): the network's
// services stop for a restart of vmnetctl, which must not cut the VMs
// off (the next server advertises at once), and when the network is
// removed, its bridge goes and the VMs with it. Closing twice is fine.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		close(s.stop)
		<-s.senderDone
		s.closeErr = s.conn.Close()
		<-s.readerDone
	})
	return s.closeErr
}

// Stats returns the number of RAs sent, of router solicitations received,
// and of those among them that got no reply of their own, for the rate
// limit: a reply was pending already, and answered them too.
func (s *Server) Stats() (sent, solicited, limited uint64) {
	return s.sent.Load(), s.solicited.Load(), s.limited.Load()
}
