package dhcpserver

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"github.com/vmnetctl/vmnetctl/leases/leasestest"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/checksum"
	"github.com/vmnetctl/vmnetctl/guestlog"
)

// TestDHCPDeclineFlood sends the handler what a hostile VM sends: a
// DECLINE, with its own MAC, of every address of a host network. The
// victim's renewal is still ACKed, a new VM still gets an OFFER and an
// ACK, every ignored DECLINE is counted as an error, and the log says so
// once, not 255 times.
func TestDHCPDeclineFlood(t *testing.T) {
	n := testNet("h", api.ModeHost, "10.9.6.0/24")
	n.LeaseTime = time.Hour
	a := leasestest.MustAllocator(t, n, "")
	a.SetClock(func() time.Time { return guardNow })
	var logs bytes.Buffer
	h := New(n, a, []netip.Addr{n.Gateway}, slog.New(slog.NewTextHandler(&logs, nil)))
	send := func(pkt []byte) *dhcpv4.DHCPv4 {
		t.Helper()
		req, err := dhcpv4.FromBytes(pkt)
		if err != nil {
			t.Fatal(err)
		}
		return h.handle(req, req.ClientHWAddr)
	}
	const victim, attacker, newVM = "52:55:55:00:07:01", "52:55:55:00:07:02", "52:55:55:00:07:03"
	gw := n.Gateway.String()
	// The victim leases an address.
	off := send(dhcpPacket(dhcpv4.MessageTypeDiscover, victim, "", "", ""))
	if off == nil || off.MessageType() != dhcpv4.MessageTypeOffer {
		t.Fatalf("victim's DISCOVER: %v", off)
	}
	vip := off.YourIPAddr.String()
	if ack := send(dhcpPacket(dhcpv4.MessageTypeRequest, victim, vip, "", gw)); ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck {
		t.Fatalf("victim's REQUEST: %v", ack)
	}
	// The flood: every address of the subnet, the victim's included.
	for ip := n.Subnet.Addr(); n.Subnet.Contains(ip); ip = ip.Next() {
		if r := send(dhcpPacket(dhcpv4.MessageTypeDecline, attacker, ip.String(), "", gw)); r != nil {
			t.Fatalf("reply to a DECLINE: %v", r)
		}
	}
	if st := h.Stats(); st.Errors != 256 || st.Requests["DECLINE"] != 256 {
		t.Fatalf("after 256 ignored DECLINEs: %d errors, %d DECLINEs counted", st.Errors, st.Requests["DECLINE"])
	}
	if got := strings.Count(logs.String(), "ignoring DHCPDECLINE"); got != 1 {
		t.Fatalf("%d log lines for 256 ignored DECLINEs within %s, want 1:\n%s", got, guestlog.Every, logs.String())
	}
	// The victim renews (unicast, ciaddr) and is ACKed its address.
	ack := send(dhcpPacket(dhcpv4.MessageTypeRequest, victim, "", vip, ""))
	if ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck || ack.YourIPAddr.String() != vip {
		t.Fatalf("victim's renewal of %s: %v", vip, ack)
	}
	// A new VM gets an address.
	off = send(dhcpPacket(dhcpv4.MessageTypeDiscover, newVM, "", "", ""))
	if off == nil || off.MessageType() != dhcpv4.MessageTypeOffer {
		t.Fatalf("new VM's DISCOVER: %v", off)
	}
	nip := off.YourIPAddr.String()
	ack = send(dhcpPacket(dhcpv4.MessageTypeRequest, newVM, nip, "", gw))
	if ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck || nip == vip {
		t.Fatalf("new VM's REQUEST of %s: %v", nip, ack)
	}
}

// A client speaks only for itself: a message whose chaddr is not the MAC
// it came from gets no answer, changes nothing and is counted.
func TestDHCPChaddrMustBeSender(t *testing.T) {
	n := testNet("h", api.ModeHost, "10.9.7.0/24")
	a := leasestest.MustAllocator(t, n, "")
	var logs bytes.Buffer
	h := New(n, a, []netip.Addr{n.Gateway}, slog.New(slog.NewTextHandler(&logs, nil)))
	sender, _ := net.ParseMAC("52:55:55:00:08:01")
	gw := n.Gateway.String()
	for i := range 100 {
		other := fmt.Sprintf("52:55:55:01:%02x:%02x", i/256, i%256)
		for _, mt := range []dhcpv4.MessageType{dhcpv4.MessageTypeDiscover, dhcpv4.MessageTypeRequest} {
			req, err := dhcpv4.FromBytes(dhcpPacket(mt, other, "10.9.7.50", "", gw))
			if err != nil {
				t.Fatal(err)
			}
			if r := h.handle(req, sender); r != nil {
				t.Fatalf("%s for %s from %s answered: %v", mt, other, sender, r)
			}
		}
	}
	if l := a.Leases(); len(l) != 0 {
		t.Fatalf("leases after 100 REQUESTs for other MACs: %v", l)
	}
	if st := h.Stats(); st.Spoofed != 200 || st.Replies["ACK"] != 0 || st.Replies["OFFER"] != 0 {
		t.Fatalf("stats: %+v, want 200 spoofed and no replies", st)
	}
	if got := strings.Count(logs.String(), "for another client address"); got != 1 {
		t.Fatalf("%d log lines for 200 spoofed messages from one sender, want 1:\n%s", got, logs.String())
	}
	// Its own request is answered.
	req, _ := dhcpv4.FromBytes(dhcpPacket(dhcpv4.MessageTypeDiscover, sender.String(), "", "", ""))
	if r := h.handle(req, sender); r == nil || r.MessageType() != dhcpv4.MessageTypeOffer {
		t.Fatalf("the sender's own DISCOVER: %v", r)
	}
}

// A VM that releases and requests its lease in a loop gets one lease event
// of each kind per guestlog.Every, not one per message: it cannot flood the
// controller's events.
func TestLeaseEventsBounded(t *testing.T) {
	n := testNet("h", api.ModeHost, "10.9.8.0/24")
	a := leasestest.MustAllocator(t, n, "")
	h := New(n, a, []netip.Addr{n.Gateway}, slog.New(slog.DiscardHandler))
	events := map[string]int{}
	h.OnLease = func(kind, _, _ string, _ netip.Addr) { events[kind]++ }
	mac, _ := net.ParseMAC("52:55:55:00:09:01")
	gw := n.Gateway.String()
	for range 100 {
		for _, mt := range []dhcpv4.MessageType{dhcpv4.MessageTypeDiscover, dhcpv4.MessageTypeRequest, dhcpv4.MessageTypeRelease} {
			ip := ""
			if mt == dhcpv4.MessageTypeRequest {
				ip = "10.9.8.2"
			}
			req, err := dhcpv4.FromBytes(dhcpPacket(mt, mac.String(), ip, "", gw))
			if err != nil {
				t.Fatal(err)
			}
			h.handle(req, mac)
		}
	}
	if st := h.Stats(); st.Replies["ACK"] != 100 {
		t.Fatalf("%d ACKs for 100 requests", st.Replies["ACK"])
	}
	if events["lease-granted"] != 1 || events["lease-released"] != 1 {
		t.Errorf("lease events for 100 request/release cycles: %v, want one of each", events)
	}
}

// TestGuestLogsBounded: guests that log from ever new MACs (a port without
// the guard) get at most maxGuestLines lines per guestlog.Every in all
// (guestlog.TestByClient checks the rest).
func TestGuestLogsBounded(t *testing.T) {
	n := testNet("l", api.ModeShared, "10.9.9.0/24")
	var logs bytes.Buffer
	h := New(n, leasestest.MustAllocator(t, n, ""), nil, slog.New(slog.NewTextHandler(&logs, nil)))
	for i := range 5000 {
		h.warn(net.HardwareAddr{0x02, 0, 0, 0, byte(i >> 8), byte(i)}, "noise")
	}
	if got := strings.Count(logs.String(), "noise"); got != maxGuestLines {
		t.Fatalf("5000 MACs logged %d lines, want %d", got, maxGuestLines)
	}
}

// sentReply is a reply the handler gave its replier.
type sentReply struct {
	to  net.HardwareAddr
	dst netip.Addr
	msg *dhcpv4.DHCPv4
}

type recordReplier []sentReply

func (r *recordReplier) reply(to net.HardwareAddr, gw, dst netip.Addr, payload []byte) error {
	m, err := dhcpv4.FromBytes(payload)
	if err != nil {
		return err
	}
	*r = append(*r, sentReply{to, dst, m})
	return nil
}

// TestDHCPReplyToSenderOnly: every reply goes to the Ethernet address its
// request came from, to the client's own address when it has one and to
// the limited broadcast otherwise (a NAK always), never to a broadcast
// frame that every VM of the network would get with the options the client
// chose; and a client that sends more than its burst is answered at its
// rate only, the rest counted.
func TestDHCPReplyToSenderOnly(t *testing.T) {
	n := testNet("h", api.ModeHost, "10.9.7.0/24")
	a := leasestest.MustAllocator(t, n, "")
	h := New(n, a, []netip.Addr{n.Gateway}, slog.New(slog.DiscardHandler))
	var sent recordReplier
	const vm = "52:55:55:00:08:01"
	mac := mustMAC(vm)
	gw := n.Gateway.String()
	bcast := netip.MustParseAddr("255.255.255.255")
	serve := func(pkt []byte, bcastFlag bool) sentReply {
		t.Helper()
		req, err := dhcpv4.FromBytes(pkt)
		if err != nil {
			t.Fatal(err)
		}
		if bcastFlag {
			req.SetBroadcast()
		}
		req.UpdateOption(dhcpv4.OptClientIdentifier([]byte("chosen by the client")))
		before := len(sent)
		h.serve(&sent, mac, req)
		if len(sent) != before+1 {
			t.Fatalf("%s: %d replies, want 1", req.MessageType(), len(sent)-before)
		}
		r := sent[len(sent)-1]
		if !bytes.Equal(r.to, mac) {
			t.Errorf("%s: reply to Ethernet address %s, want the sender's %s", req.MessageType(), r.to, mac)
		}
		return r
	}
	off := serve(dhcpPacket(dhcpv4.MessageTypeDiscover, vm, "", "", ""), true)
	if off.dst != bcast || off.msg.MessageType() != dhcpv4.MessageTypeOffer {
		t.Errorf("OFFER to %s (%s), want %s", off.dst, off.msg.MessageType(), bcast)
	}
	ip := off.msg.YourIPAddr.String()
	if ack := serve(dhcpPacket(dhcpv4.MessageTypeRequest, vm, ip, "", gw), false); ack.dst != bcast {
		t.Errorf("ACK of a client without an address to %s, want %s", ack.dst, bcast)
	}
	// Renewing, and asking for options: unicast to its address even
	// with the broadcast flag.
	if ack := serve(dhcpPacket(dhcpv4.MessageTypeRequest, vm, "", ip, gw), true); ack.dst.String() != ip {
		t.Errorf("ACK of a renewal to %s, want %s", ack.dst, ip)
	}
	if ack := serve(dhcpPacket(dhcpv4.MessageTypeInform, vm, "", ip, gw), true); ack.dst.String() != ip {
		t.Errorf("INFORM's ACK to %s, want %s", ack.dst, ip)
	}
	// Another address than its own: a NAK, broadcast, still to it alone.
	other := n.Subnet.Addr().Next().Next().Next().String()
	if nak := serve(dhcpPacket(dhcpv4.MessageTypeRequest, vm, other, ip, gw), false); nak.dst != bcast || nak.msg.MessageType() != dhcpv4.MessageTypeNak {
		t.Errorf("NAK to %s (%s), want %s", nak.dst, nak.msg.MessageType(), bcast)
	}

	// The rate: 5 messages so far, a burst of dhcpBurst in all.
	inform, _ := dhcpv4.FromBytes(dhcpPacket(dhcpv4.MessageTypeInform, vm, "", ip, gw))
	for range 100 {
		h.serve(&sent, mac, inform)
	}
	if len(sent) < dhcpBurst || len(sent) > dhcpBurst+1 {
		t.Errorf("%d replies to a flood, want the burst of %d (and one more if the clock moved)", len(sent), dhcpBurst)
	}
	if st := h.Stats(); st.Limited < 100-dhcpBurst {
		t.Errorf("%d messages counted as over the rate, want at least %d", st.Limited, 100-dhcpBurst)
	}
	// Another client has a rate of its own.
	other2 := mustMAC("52:55:55:00:08:02")
	disc, _ := dhcpv4.FromBytes(dhcpPacket(dhcpv4.MessageTypeDiscover, other2.String(), "", "", ""))
	before := len(sent)
	h.serve(&sent, other2, disc)
	if len(sent) != before+1 {
		t.Errorf("another client was not answered while the first was over its rate")
	}
}

// TestUDP4Packet: the reply's IPv4 header and UDP datagram carry valid
// checksums (what the kernel and the client check).
func TestUDP4Packet(t *testing.T) {
	for _, size := range []int{0, 1, 300, 301, 1400} {
		payload := bytes.Repeat([]byte{0xa5, 0x5a, 0xff}, size)[:size]
		p := udp4Packet(netip.MustParseAddr("10.9.7.1"), netip.MustParseAddr("255.255.255.255"), 67, 68, payload)
		if len(p) != 28+size || p[0] != 0x45 || p[9] != 17 || int(binary.BigEndian.Uint16(p[2:])) != len(p) {
			t.Fatalf("size %d: header %x", size, p[:28])
		}
		if c := checksum.Of(p[:20]); c != 0 {
			t.Errorf("size %d: IPv4 header checksum does not verify (%#x)", size, c)
		}
		pseudo := append(append([]byte{}, p[12:20]...), 0, 17, p[24], p[25])
		if c := checksum.Of(pseudo, p[20:]); c != 0 {
			t.Errorf("size %d: UDP checksum does not verify (%#x)", size, c)
		}
		if !bytes.Equal(p[28:], payload) || binary.BigEndian.Uint16(p[20:]) != 67 || binary.BigEndian.Uint16(p[22:]) != 68 {
			t.Errorf("size %d: ports or payload wrong: %x", size, p[20:28])
		}
	}
}

// TestDHCPHostnameBytes: a host name a client sends is kept only if it is
// one: escape sequences, line breaks and other bytes leave the lease
// without a name (it is logged and printed to terminals).
func TestDHCPHostnameBytes(t *testing.T) {
	n := testNet("h", api.ModeHost, "10.9.12.0/24")
	a := leasestest.MustAllocator(t, n, "")
	h := New(n, a, []netip.Addr{n.Gateway}, slog.New(slog.DiscardHandler))
	for i, c := range []struct{ sent, kept string }{
		{"web-1.example", "web-1.example"},
		{"a\x1b]52;c;eA==\a", ""},
		{"a\nfake row", ""},
		{"caf\xc3\xa9", ""},
	} {
		mac := fmt.Sprintf("52:55:55:00:0c:%02x", i)
		off := h.handle(mustDHCP(t, dhcpPacket(dhcpv4.MessageTypeDiscover, mac, "", "", "")), mustMAC(mac))
		if off == nil {
			t.Fatalf("%q: no OFFER", c.sent)
		}
		req := mustDHCP(t, dhcpPacket(dhcpv4.MessageTypeRequest, mac, off.YourIPAddr.String(), "", n.Gateway.String()))
		req.UpdateOption(dhcpv4.OptHostName(c.sent))
		if ack := h.handle(req, mustMAC(mac)); ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck {
			t.Fatalf("%q: REQUEST not ACKed: %v", c.sent, ack)
		}
		if l, _ := a.Lookup(mustMAC(mac)); l.Hostname != c.kept {
			t.Errorf("host name %q kept as %q, want %q", c.sent, l.Hostname, c.kept)
		}
	}
}

func mustDHCP(t *testing.T, b []byte) *dhcpv4.DHCPv4 {
	t.Helper()
	m, err := dhcpv4.FromBytes(b)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
