package dhcpserver

import (
	"bytes"
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/guestlog"
	"github.com/vmnetctl/vmnetctl/leases"
	"golang.org/x/time/rate"
)

// Server answers DHCP clients of one network from its Allocator. The
// socket is server4's; the decisions are here, so they can be tested with
// packets alone.
type Server struct {
	n     *api.Network
	alloc *leases.Allocator
	dns   []net.IP
	log   *slog.Logger

	// OnLease, if set, is told of leases granted, released and declined.
	OnLease func(kind, network, mac string, ip netip.Addr)
	// Bound, if set, is told of each change to what a MAC is bound to,
	// before the client hears of it: the guard lets the VM use the
	// address from then on.
	Bound func(mac net.HardwareAddr)

	mu    sync.Mutex
	stats Stats
	// guestLog rate-limits, per client MAC, the log lines that clients
	// trigger: a VM can send DHCP messages as fast as it likes.
	guestLog guestlog.ByClient
	// leaseEvents rate-limits onLease per client MAC and kind, as guestLog
	// the log: a VM that releases and requests in a loop must not flood
	// the events (one of each kind per guestlog.Every).
	leaseEvents guestlog.ByClient
	// limits bounds the messages each client may have answered: a change
	// to a lease costs a guard transaction, and the server answers one
	// message at a time, so a VM releasing and requesting in a loop would
	// otherwise keep every other VM from getting a lease.
	limits clientLimits
}

// clientLimits are per-client token buckets (golang.org/x/time/rate), at
// most guestlog.MaxClients of them: when full they start again, a bound on
// memory that only a port without the guard, which may send from any
// MAC, can reach.
type clientLimits struct {
	mu      sync.Mutex
	buckets map[string]*rate.Limiter
}

// A client may send dhcpBurst messages at once and dhcpRate a second after
// that: a booting VM sends two to four, a renewing one one, and a client
// that retries backs off (RFC 2131, 4.1).
const (
	dhcpRate  = 2
	dhcpBurst = 10
)

func (c *clientLimits) allow(key string, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.buckets == nil || len(c.buckets) >= guestlog.MaxClients {
		c.buckets = map[string]*rate.Limiter{}
	}
	l := c.buckets[key]
	if l == nil {
		l = rate.NewLimiter(dhcpRate, dhcpBurst)
		c.buckets[key] = l
	}
	return l.AllowN(now, 1)
}

// maxGuestLines bounds the log lines all guests together trigger in a
// network's DHCP server per guestlog.Every.
const maxGuestLines = 20

// warn logs a line a client triggered, at most one per guestlog.Every per
// client.
func (h *Server) warn(mac net.HardwareAddr, msg string, args ...any) {
	if ok, held := h.guestLog.Allow(mac.String(), time.Now()); ok {
		h.log.Warn(msg, append(args, "mac", mac.String(), "suppressed", held)...)
	}
}

// New is network n's server, handing out alloc's addresses and dns as the
// clients' DNS servers.
func New(n *api.Network, alloc *leases.Allocator, dns []netip.Addr, log *slog.Logger) *Server {
	h := &Server{n: n, alloc: alloc, log: log, guestLog: guestlog.ByClient{Total: maxGuestLines},
		stats: Stats{Requests: map[string]uint64{}, Replies: map[string]uint64{}}}
	for _, a := range dns {
		h.dns = append(h.dns, net.IP(a.AsSlice()))
	}
	return h
}

func (h *Server) count(req string, reply string, failed bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if req != "" {
		h.stats.Requests[req]++
	}
	if reply != "" {
		h.stats.Replies[reply]++
	}
	if failed {
		h.stats.Errors++
	}
}

// Stats returns a copy of the counters.
func (h *Server) Stats() Stats {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := Stats{Requests: map[string]uint64{}, Replies: map[string]uint64{}, Errors: h.stats.Errors, Spoofed: h.stats.Spoofed, Limited: h.stats.Limited}
	for k, v := range h.stats.Requests {
		s.Requests[k] = v
	}
	for k, v := range h.stats.Replies {
		s.Replies[k] = v
	}
	return s
}

// replier sends a DHCP reply: Socket's.
type replier interface {
	reply(to net.HardwareAddr, gw, dst netip.Addr, payload []byte) error
}

// serve answers req, which came from the Ethernet address src, through s:
// to src alone (replyAddr), within src's rate (limiter).
func (h *Server) serve(s replier, src net.HardwareAddr, req *dhcpv4.DHCPv4) {
	if !h.limits.allow(src.String(), time.Now()) {
		h.mu.Lock()
		h.stats.Limited++
		h.mu.Unlock()
		return
	}
	reply := h.handle(req, src)
	if reply == nil {
		return
	}
	dst := replyAddr(req, reply)
	if err := s.reply(src, h.n.Gateway, dst, reply.ToBytes()); err != nil {
		h.warn(req.ClientHWAddr, "sending DHCP reply", "to", dst, "type", reply.MessageType(), "err", err)
		h.count("", "", true)
	}
}

// replyAddr is the IP destination of reply to req (RFC 2131, 4.1): the
// client's address when it says it has one (renewing, DHCPINFORM), else
// the limited broadcast, which a client without an address takes (there
// is no ARP to answer first); a DHCPNAK is always broadcast. Either way the
// frame goes to the client's Ethernet address alone and to its port 68,
// whatever port it sent from: a reply, with the options it echoes, never
// reaches another VM, nor another port of this one.
func replyAddr(req, reply *dhcpv4.DHCPv4) netip.Addr {
	if reply.MessageType() != dhcpv4.MessageTypeNak {
		if a, ok := netip.AddrFromSlice(req.ClientIPAddr.To4()); ok && !a.IsUnspecified() {
			return a
		}
	}
	return netip.AddrFrom4([4]byte{255, 255, 255, 255})
}

// handle returns the reply to req, sent from the Ethernet address src, or
// nil when there is none to send. A client speaks only for itself: a
// message whose client address (chaddr) is not its sender's is dropped, so
// that a VM, whose sender address the guard pins to its port, can only
// obtain, renew, release or decline its own lease.
func (h *Server) handle(req *dhcpv4.DHCPv4, src net.HardwareAddr) *dhcpv4.DHCPv4 {
	mt := req.MessageType()
	name := "other"
	switch mt {
	case dhcpv4.MessageTypeDiscover, dhcpv4.MessageTypeRequest, dhcpv4.MessageTypeRelease,
		dhcpv4.MessageTypeDecline, dhcpv4.MessageTypeInform:
		name = mt.String()
	}
	if req.OpCode != dhcpv4.OpcodeBootRequest || req.HWType != iana.HWTypeEthernet || len(req.ClientHWAddr) != 6 {
		h.count(name, "", true)
		return nil
	}
	mac := req.ClientHWAddr
	if !bytes.Equal(mac, src) {
		h.mu.Lock()
		h.stats.Spoofed++
		h.mu.Unlock()
		h.count(name, "", false)
		h.warn(src, "ignoring a DHCP message for another client address", "chaddr", mac)
		return nil
	}
	gw := net.IP(h.n.Gateway.AsSlice())
	if sid := req.ServerIdentifier(); sid != nil && !sid.Equal(gw) && mt != dhcpv4.MessageTypeDiscover {
		// The client chose, or talks to, another server.
		h.count(name, "", false)
		return nil
	}
	switch mt {
	case dhcpv4.MessageTypeDiscover:
		ip, err := h.alloc.Offer(mac, addrOf(req.RequestedIPAddress()))
		if err != nil {
			h.warn(mac, "no address to offer", "err", err)
			h.count(name, "", true)
			return nil
		}
		h.count(name, "OFFER", false)
		return h.reply(req, dhcpv4.MessageTypeOffer, ip)
	case dhcpv4.MessageTypeRequest:
		ip := addrOf(req.RequestedIPAddress())
		if !ip.IsValid() {
			ip = addrOf(req.ClientIPAddr) // renewing or rebinding
		}
		prev, had := h.alloc.Lookup(mac)
		l, err := h.alloc.Commit(mac, ip, clientHostname(req.HostName()))
		if err != nil {
			h.warn(mac, "refusing DHCP request", "ip", ip, "err", err)
			h.count(name, "NAK", false)
			nak, err := dhcpv4.NewReplyFromRequest(req, dhcpv4.WithMessageType(dhcpv4.MessageTypeNak),
				dhcpv4.WithOption(dhcpv4.OptServerIdentifier(gw)))
			if err != nil {
				return nil
			}
			return nak
		}
		h.log.Debug("leased", "mac", mac.String(), "ip", l.IP, "hostname", l.Hostname)
		h.changed(mac)
		if !had || prev.IP != l.IP {
			h.event("lease-granted", mac, l.IP)
		}
		h.count(name, "ACK", false)
		return h.reply(req, dhcpv4.MessageTypeAck, l.IP)
	case dhcpv4.MessageTypeDecline:
		// Only the holder of a lease on the address may decline it;
		// anything else is ignored, and counted as an error.
		ip := addrOf(req.RequestedIPAddress())
		err := h.alloc.Decline(mac, ip)
		switch {
		case errors.Is(err, leases.ErrNotHolder):
			h.warn(mac, "ignoring DHCPDECLINE of an address the client does not hold", "ip", ip)
		case err != nil:
			h.warn(mac, "declining lease", "ip", ip, "err", err)
		default:
			h.warn(mac, "client declined its address: another host uses it", "ip", ip)
			h.changed(mac)
			h.event("lease-declined", mac, ip)
		}
		h.count(name, "", err != nil)
		return nil
	case dhcpv4.MessageTypeRelease:
		prev, had := h.alloc.Lookup(mac)
		if err := h.alloc.Release(mac); err != nil {
			h.warn(mac, "releasing lease", "err", err)
		} else if had {
			h.event("lease-released", mac, prev.IP)
		}
		h.changed(mac)
		h.count(name, "", false)
		return nil
	case dhcpv4.MessageTypeInform:
		h.count(name, "ACK", false)
		r := h.reply(req, dhcpv4.MessageTypeAck, netip.Addr{})
		if r != nil {
			r.DeleteOption(dhcpv4.OptionIPAddressLeaseTime)
		}
		return r
	}
	h.count(name, "", false)
	return nil
}

// clientHostname is the host name a client sent (option 12) if it is one:
// letters, digits, '-', '_' and '.', at most 253 bytes; else none. The
// option is any bytes a guest likes, and the name is kept, logged and
// printed (`vmnetctl leases`): a terminal's escape sequences or a line of
// its own must not pass.
func clientHostname(name string) string {
	if len(name) > 253 || strings.ContainsFunc(name, func(r rune) bool { return !api.HostNameChar(r) && r != '.' }) {
		return ""
	}
	return name
}

// event tells onLease, if set, of a lease event.
func (h *Server) event(kind string, mac net.HardwareAddr, ip netip.Addr) {
	if h.OnLease == nil {
		return
	}
	if ok, _ := h.leaseEvents.Allow(mac.String()+"/"+kind, time.Now()); ok {
		h.OnLease(kind, h.n.ID, mac.String(), ip)
	}
}

// changed tells bound, if set, that mac's addresses changed.
func (h *Server) changed(mac net.HardwareAddr) {
	if h.Bound != nil {
		h.Bound(mac)
	}
}

func addrOf(ip net.IP) netip.Addr {
	a, ok := netip.AddrFromSlice(ip.To4())
	if !ok || a.IsUnspecified() {
		return netip.Addr{}
	}
	return a
}

// reply builds an OFFER or ACK for yiaddr with the network's options.
func (h *Server) reply(req *dhcpv4.DHCPv4, mt dhcpv4.MessageType, yiaddr netip.Addr) *dhcpv4.DHCPv4 {
	gw := net.IP(h.n.Gateway.AsSlice())
	mask := net.CIDRMask(h.n.Subnet.Bits(), 32)
	lt := h.alloc.LeaseTime()
	mtu := make([]byte, 2)
	binary.BigEndian.PutUint16(mtu, uint16(h.n.MTU))
	mods := []dhcpv4.Modifier{
		dhcpv4.WithMessageType(mt),
		dhcpv4.WithServerIP(gw),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(gw)),
		dhcpv4.WithOption(dhcpv4.OptSubnetMask(mask)),
		dhcpv4.WithOption(dhcpv4.OptRouter(gw)),
		dhcpv4.WithOption(dhcpv4.OptIPAddressLeaseTime(lt)),
		dhcpv4.WithOption(dhcpv4.OptRenewTimeValue(lt / 2)),
		dhcpv4.WithOption(dhcpv4.OptRebindingTimeValue(lt * 7 / 8)),
		dhcpv4.WithOption(dhcpv4.OptGeneric(dhcpv4.OptionInterfaceMTU, mtu)),
	}
	if len(h.dns) > 0 {
		mods = append(mods, dhcpv4.WithOption(dhcpv4.OptDNS(h.dns...)))
	}
	if yiaddr.IsValid() {
		mods = append(mods, dhcpv4.WithYourIP(net.IP(yiaddr.AsSlice())))
	}
	r, err := dhcpv4.NewReplyFromRequest(req, mods...)
	if err != nil {
		h.log.Warn("building DHCP reply", "err", err)
		return nil
	}
	return r
}
