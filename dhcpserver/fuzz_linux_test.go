package dhcpserver

import (
	"fmt"
	"github.com/vmnetctl/vmnetctl/leases/leasestest"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/leases"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// The fuzzers' networks and clock (testutil.FuzzNetwork).
var (
	fuzzNet      = testutil.FuzzNetwork
	fuzzNow      = testutil.FuzzNow
	fuzzFixedMAC = testutil.FuzzFixedMAC
)

// fuzzHeld are leases of other MACs that the DHCP fuzzer's allocator starts
// with: some unexpired (never to be handed to anyone else), one expired.
func fuzzHeld(n *api.Network) []leases.Lease {
	base := n.DHCPStart
	if !n.Subnet.Contains(base.Prev()) { // the /29: start at the network address
		base = base.Next().Next() // .2, past the gateway
	}
	var ls []leases.Lease
	for i, exp := range []time.Duration{time.Hour, -time.Hour, time.Hour, time.Hour} {
		ls = append(ls, leases.Lease{MAC: fmt.Sprintf("52:55:55:00:00:a%d", i+1), IP: base, Expiry: fuzzNow.Add(exp)})
		base = base.Next()
	}
	return ls
}

// handOutRules is what an allocator had bound before the DHCP handler
// acted, read through its public methods: the fixed addresses (the
// network's reservations), the unexpired leases and the declined
// addresses of the range.
type handOutRules struct {
	fixed    map[string]netip.Addr
	leased   map[netip.Addr]string
	declined map[netip.Addr]bool
}

func rulesOf(n *api.Network, a *leases.Allocator) handOutRules {
	r := handOutRules{fixed: map[string]netip.Addr{}, leased: map[netip.Addr]string{}, declined: map[netip.Addr]bool{}}
	for _, res := range n.Reservations {
		r.fixed[res.MAC] = res.IP
	}
	for _, l := range a.Leases() {
		r.leased[l.IP] = l.MAC
	}
	for ip := n.DHCPStart; n.Subnet.Contains(ip) && !n.DHCPEnd.Less(ip); ip = ip.Next() {
		r.declined[ip] = a.Declined(ip)
	}
	return r
}

// checkHandOut fails when addr may not be given to mac by r's network n:
// mac's fixed address exactly if it has one; else an address of the DHCP
// range that is not the network, broadcast or gateway address, not fixed
// for another MAC, not leased (unexpired) to another MAC and not declined.
func checkHandOut(t *testing.T, n *api.Network, r handOutRules, mac string, addr netip.Addr) {
	t.Helper()
	if f, ok := r.fixed[mac]; ok {
		if addr != f {
			t.Fatalf("%s has the fixed address %s but was given %s", mac, f, addr)
		}
		return
	}
	switch {
	case !addr.IsValid() || addr.Less(n.DHCPStart) || n.DHCPEnd.Less(addr):
		t.Fatalf("%s was given %s, outside the DHCP range %s-%s", mac, addr, n.DHCPStart, n.DHCPEnd)
	case addr == n.Subnet.Masked().Addr():
		t.Fatalf("%s was given the network address %s", mac, addr)
	case addr == testutil.Broadcast(n.Subnet):
		t.Fatalf("%s was given the broadcast address %s", mac, addr)
	case addr == n.Gateway:
		t.Fatalf("%s was given the gateway address %s", mac, addr)
	}
	for m, f := range r.fixed {
		if f == addr && m != mac {
			t.Fatalf("%s was given %s, fixed for %s", mac, addr, m)
		}
	}
	if m, ok := r.leased[addr]; ok && m != mac {
		t.Fatalf("%s was given %s, leased to %s", mac, addr, m)
	}
	if r.declined[addr] {
		t.Fatalf("%s was given %s, declined", mac, addr)
	}
}

// holdLeases gives a the leases held, each committed at the time that
// makes its expiry the one it names; a's clock is fuzzNow after.
func holdLeases(t *testing.T, a *leases.Allocator, held []leases.Lease) {
	t.Helper()
	for _, l := range held {
		a.SetClock(func() time.Time { return l.Expiry.Add(-a.LeaseTime()) })
		if _, err := a.Commit(mustMAC(l.MAC), l.IP, ""); err != nil {
			t.Fatalf("holding %+v: %v", l, err)
		}
	}
	a.SetClock(func() time.Time { return fuzzNow })
}

// dhcpPacket is a client's message for the seeds.
func dhcpPacket(mt dhcpv4.MessageType, mac string, requested, ciaddr, serverID string) []byte {
	mods := []dhcpv4.Modifier{dhcpv4.WithHwAddr(mustMAC(mac)), dhcpv4.WithMessageType(mt)}
	if requested != "" {
		mods = append(mods, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.ParseIP(requested))))
	}
	if ciaddr != "" {
		mods = append(mods, dhcpv4.WithClientIP(net.ParseIP(ciaddr)))
	}
	if serverID != "" {
		mods = append(mods, dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.ParseIP(serverID))))
	}
	m, err := dhcpv4.New(mods...)
	if err != nil {
		panic(err)
	}
	return m.ToBytes()
}

// FuzzDHCPHandle feeds the DHCP handler's decision function a sequence of
// raw packets, as VMs could send them, on a network whose allocator already
// has leases of other MACs. Every reply answers the request (reply opcode,
// same MAC and transaction); an OFFER or ACK gives the client its fixed
// address, or else an address of the DHCP range that is neither the
// network, broadcast nor gateway address, nor fixed, leased or declined for
// another MAC; an ACK to a REQUEST is the client's lease from then on; a NAK
// or an INFORM's ACK gives no address; and no two clients ever hold one
// address.
func FuzzDHCPHandle(f *testing.F) {
	const m1, m2 = "52:55:55:00:00:01", "52:55:55:00:00:02"
	d, r := dhcpv4.MessageTypeDiscover, dhcpv4.MessageTypeRequest
	for _, s := range []struct {
		cfg  byte
		pkts [4][]byte
	}{
		{0, [4][]byte{dhcpPacket(d, m1, "", "", ""), dhcpPacket(r, m1, "10.9.0.104", "", "10.9.0.1"),
			dhcpPacket(dhcpv4.MessageTypeRelease, m1, "", "10.9.0.104", "10.9.0.1"), dhcpPacket(d, m2, "10.9.0.104", "", "")}},
		// Addresses of others: leased, expired, fixed; a foreign server.
		{0, [4][]byte{dhcpPacket(r, m1, "10.9.0.100", "", ""), dhcpPacket(d, m1, "10.9.0.101", "", ""),
			dhcpPacket(r, m2, "10.9.0.20", "", "10.9.0.1"), dhcpPacket(r, m2, "10.9.0.120", "", "10.9.0.254")}},
		{0, [4][]byte{dhcpPacket(d, fuzzFixedMAC, "10.9.0.120", "", ""), dhcpPacket(r, fuzzFixedMAC, "10.9.0.20", "", ""),
			dhcpPacket(dhcpv4.MessageTypeInform, m1, "", "10.9.0.130", ""), dhcpPacket(r, m1, "", "10.9.0.130", "")}},
		{0, [4][]byte{dhcpPacket(r, m1, "10.9.0.110", "", ""), dhcpPacket(dhcpv4.MessageTypeDecline, m1, "10.9.0.110", "", "10.9.0.1"),
			dhcpPacket(d, m2, "10.9.0.110", "", ""), dhcpPacket(r, m2, "10.9.0.110", "", "")}},
		// Network, broadcast, gateway, and the last free addresses.
		{1, [4][]byte{dhcpPacket(r, m1, "10.9.1.0", "", ""), dhcpPacket(r, m1, "10.9.1.7", "", ""),
			dhcpPacket(r, m1, "10.9.1.1", "", ""), dhcpPacket(d, m1, "10.9.1.0", "", "")}},
		{1, [4][]byte{dhcpPacket(d, m1, "", "", ""), dhcpPacket(r, m1, "10.9.1.6", "", ""),
			dhcpPacket(d, m2, "", "", ""), dhcpPacket(r, m2, "10.9.1.3", "", "")}},
	} {
		f.Add(s.cfg, s.pkts[0], s.pkts[1], s.pkts[2], s.pkts[3])
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	f.Fuzz(func(t *testing.T, cfg byte, p1, p2, p3, p4 []byte) {
		n := fuzzNet(cfg)
		a := leasestest.MustAllocator(t, n, "")
		holdLeases(t, a, fuzzHeld(n))
		h := New(n, a, []netip.Addr{n.Gateway}, log)
		for _, b := range [][]byte{p1, p2, p3, p4} {
			req, err := dhcpv4.FromBytes(b)
			if err != nil {
				continue
			}
			mac := req.ClientHWAddr.String()
			// What the handler may hand out is decided before it acts.
			var snap *handOutRules
			if len(req.ClientHWAddr) == 6 {
				r := rulesOf(n, a)
				snap = &r
			}
			reply := h.handle(req, req.ClientHWAddr)
			leasestest.CheckLeases(t, a)
			if reply == nil {
				continue
			}
			if reply.OpCode != dhcpv4.OpcodeBootReply || reply.TransactionID != req.TransactionID ||
				reply.ClientHWAddr.String() != mac || snap == nil {
				t.Fatalf("reply %v does not answer %v", reply, req)
			}
			yi := addrOf(reply.YourIPAddr)
			switch mt, rt := req.MessageType(), reply.MessageType(); {
			case mt == dhcpv4.MessageTypeDiscover && rt == dhcpv4.MessageTypeOffer:
				checkHandOut(t, n, *snap, mac, yi)
			case mt == dhcpv4.MessageTypeRequest && rt == dhcpv4.MessageTypeAck:
				checkHandOut(t, n, *snap, mac, yi)
				if l, ok := a.Lookup(req.ClientHWAddr); !ok || l.IP != yi {
					t.Fatalf("ACK of %s to %s, but its lease is %+v, %v", yi, mac, l, ok)
				}
			case mt == dhcpv4.MessageTypeRequest && rt == dhcpv4.MessageTypeNak,
				mt == dhcpv4.MessageTypeInform && rt == dhcpv4.MessageTypeAck:
				if yi.IsValid() {
					t.Fatalf("%s to a %s gives the address %s", rt, mt, yi)
				}
			default:
				t.Fatalf("%s in reply to a %s", rt, mt)
			}
		}
	})
}
