package netplane

import (
	"bytes"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/vmnetctl/vmnetctl/api"
)

// TestDHCPDeclineFlood sends the handler what a hostile VM sends: a
// DECLINE, with its own MAC, of every address of a host network. The
// victim's renewal is still ACKed, a new VM still gets an OFFER and an
// ACK, every ignored DECLINE is counted as an error, and the log says so
// once, not 255 times.
func TestDHCPDeclineFlood(t *testing.T) {
	n := testNet("h", api.ModeHost, "10.9.6.0/24")
	n.LeaseTime = time.Hour
	a := mustAllocator(t, n, "")
	a.now = func() time.Time { return guardNow }
	var logs bytes.Buffer
	h := newDHCPHandler(n, a, []netip.Addr{n.Gateway}, slog.New(slog.NewTextHandler(&logs, nil)))
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
		t.Fatalf("%d log lines for 256 ignored DECLINEs within %s, want 1:\n%s", got, logEvery, logs.String())
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
	a := mustAllocator(t, n, "")
	var logs bytes.Buffer
	h := newDHCPHandler(n, a, []netip.Addr{n.Gateway}, slog.New(slog.NewTextHandler(&logs, nil)))
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
// of each kind per logEvery, not one per message: it cannot flood the
// controller's events.
func TestLeaseEventsBounded(t *testing.T) {
	n := testNet("h", api.ModeHost, "10.9.8.0/24")
	a := mustAllocator(t, n, "")
	h := newDHCPHandler(n, a, []netip.Addr{n.Gateway}, slog.New(slog.DiscardHandler))
	events := map[string]int{}
	h.onLease = func(kind, _, _ string, _ netip.Addr) { events[kind]++ }
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
// the guard) get at most maxGuestLines lines per logEvery in all, the next
// line that passes says how many were held back, and one MAC gets one.
func TestGuestLogsBounded(t *testing.T) {
	n := testNet("l", api.ModeShared, "10.9.9.0/24")
	var logs bytes.Buffer
	h := newDHCPHandler(n, mustAllocator(t, n, ""), nil, slog.New(slog.NewTextHandler(&logs, nil)))
	for i := range 5000 {
		h.warn(net.HardwareAddr{0x02, 0, 0, 0, byte(i >> 8), byte(i)}, "noise")
	}
	if got := strings.Count(logs.String(), "noise"); got != maxGuestLines {
		t.Fatalf("5000 MACs logged %d lines, want %d", got, maxGuestLines)
	}
	// The next window: a line passes, with the count of those held back.
	g := &guestLogs{total: 2}
	now := guardNow
	for i := range 10 {
		if ok, _ := g.allow(fmt.Sprint(i), now); ok != (i < 2) {
			t.Fatalf("line %d: allowed %v", i, ok)
		}
	}
	if ok, held := g.allow("late", now.Add(logEvery)); !ok || held != 8 {
		t.Fatalf("after the window: allowed %v, %d held back; want true, 8", ok, held)
	}
	if ok, _ := g.allow("late", now.Add(logEvery+time.Second)); ok {
		t.Fatal("one MAC logged twice within logEvery")
	}
}
