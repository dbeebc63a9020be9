package arplearn

import (
	"net"
	"net/netip"
	"testing"
)

// TestDeferredClaimsBounded: a guest that floods ARP claims before the
// network's VMs are known (a network that just came up) has the learner
// keep maxDeferred of them, the newest, whatever it sends: its memory
// is bounded, and the claims claimed once the VMs are known are the
// latest.
func TestDeferredClaimsBounded(t *testing.T) {
	l := &Learner{}
	mac := net.HardwareAddr{0x52, 0x55, 0x55, 0, 0, 1}
	for i := range 10_000 {
		ip := netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)})
		l.claim(arpSeen{mac: mac, ip: ip})
	}
	if got := l.Deferred(); got != maxDeferred {
		t.Fatalf("10,000 claims before VMsKnown: %d kept, want %d", got, maxDeferred)
	}
	if last := l.deferred[len(l.deferred)-1].a.ip; last != netip.AddrFrom4([4]byte{10, 0, 39, 15}) {
		t.Errorf("the newest kept is %s, want the last claim's, 10.0.39.15", last)
	}
}
