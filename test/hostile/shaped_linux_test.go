package hostile

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/test/simvm"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestHostileShapedLink: a guest whose link its helper shapes (every
// frame it sends held 200 ms and sent twice: `impair: {delay: {fromVM:
// 200ms}, duplicate: {fromVM: 100%}}`) writes raw frames on its own
// socket. Its echo request to the gateway is answered twice; frames from
// another VM's address, and from a MAC not its own, are dropped by its
// port's guard, both copies, counted; a flood of 5,000 frames fills its
// own helper's line, the rest dropped and counted, its helper's memory
// bounded. The other VM meanwhile reaches its gateway from its lease, and
// the host's neighbour entry for that address keeps its MAC.
func TestHostileShapedLink(t *testing.T) {
	h := simvm.NewHost(t, "vmnsh", "vmnet:\n  shared:\n    subnet: 10.84.0.0/24\n")
	vms := func(impair string) string {
		return h.WriteFile("vms.yaml", "vms:\n  victim:\n    networks: [{vmnet: shared}]\n  shaper:\n    networks:\n      - vmnet: shared\n        macAddress: \"52:55:55:ab:00:01\"\n"+impair)
	}
	h.MustVmnetctl("up", "-f", vms(""))
	st := h.Status()
	victim := h.VM(h.Attachment(st, "victim"))
	victimIP := netip.MustParseAddr(strings.TrimSpace(victim.DHCP(t)["ip"]))
	gw := netip.MustParseAddr("10.84.0.1")
	sa := h.Attachment(st, "shaper")
	a := newAttacker(t, mustMAC(sa.MAC), sa.Socket, filepath.Join(h.Dir, "shaper.sock"))
	own := a.lease() // (before the shaping: the lease takes no second)
	h.MustVmnetctl("up", "-f", vms("        impair: {delay: {fromVM: 200ms}, duplicate: {fromVM: 100%}}\n"))
	if b := h.Attachment(h.Status(), "shaper"); b.PID != sa.PID {
		t.Fatalf("the shaping restarted the helper: pid %d, then %d", sa.PID, b.PID)
	}
	var bridge string
	for _, n := range h.Status().Networks {
		if n.Name == "shared" {
			bridge = n.Bridge
		}
	}
	gwMAC := mustMAC(strings.TrimSpace(h.MustRun(t, "cat", "/sys/class/net/"+bridge+"/address")))

	// Its own echo request: held, sent twice, answered twice.
	sent := time.Now()
	a.send(ether(gwMAC, a.mac, etherIPv4, icmpEcho(own, gw)))
	if replies := a.echoReplies(own, gw, 2); replies != 2 {
		t.Errorf("one echo request through a link that sends it twice: %d replies", replies)
	} else if took := time.Since(sent); took < 200*time.Millisecond {
		t.Errorf("the replies came after %v, before the link's 200 ms", took)
	}

	// From the victim's address, and from a MAC not its own: both copies
	// of each dropped by the guard.
	before := h.Attachment(h.Status(), "shaper").SpoofDrops
	foreign := mustMAC("52:55:55:ab:00:99")
	for range 10 {
		a.send(ether(gwMAC, a.mac, etherIPv4, icmpEcho(victimIP, gw)))
		a.send(ether(gwMAC, foreign, etherIPv4, icmpEcho(own, gw)))
	}
	testutil.Eventually(t, time.Minute, func() error {
		if d := h.Attachment(h.Status(), "shaper").SpoofDrops; d < before+40 {
			return fmt.Errorf("%d spoofed frames dropped, %d before: want both copies of 20", d, before)
		}
		return nil
	}, "the guard to drop both copies of the spoofed frames")

	// A flood: its own line fills, the rest is dropped, counted.
	dropsBefore := h.Attachment(h.Status(), "shaper").Drops
	frame := ether(gwMAC, a.mac, etherIPv4, icmpEcho(own, gw))
	for range 5000 {
		a.send(frame)
	}
	testutil.Eventually(t, time.Minute, func() error {
		if d := h.Attachment(h.Status(), "shaper").Drops; d <= dropsBefore {
			return fmt.Errorf("helper drops %d, %d before the flood", d, dropsBefore)
		}
		return nil
	}, "the shaper's helper to count the frames its full line dropped")
	kb := testutil.PrivateKB(t, sa.PID)
	t.Logf("the shaper's helper after a flood of 5,000 frames: %d kB of private memory", kb)
	if kb > 64<<10 {
		t.Errorf("the shaper's helper holds %d kB after the flood: its line is bounded at 1000 frames", kb)
	}

	// The victim is unaffected.
	if err := victim.Ping(gw.String(), 3); err != nil {
		t.Errorf("the victim's ping of its gateway, after the shaper's attacks: %v", err)
	}
	if out := h.MustRun(t, "ip", "neigh", "show", victimIP.String(), "dev", bridge); !strings.Contains(out, strings.ToLower(victim.MAC)) {
		t.Errorf("the host's neighbour entry for the victim's address %s: %q, want its MAC %s", victimIP, out, victim.MAC)
	}
}

// echoReplies reads the frames the attacker gets until want ICMP echo
// replies from src came, or a minute passed, and returns how many did;
// it answers the ARP requests for its address ip meanwhile (the replies
// wait for them), as query does.
func (a *attacker) echoReplies(ip, src netip.Addr, want int) int {
	a.t.Helper()
	deadline := time.Now().Add(time.Minute)
	buf := make([]byte, 65536)
	got := 0
	for got < want {
		f := a.read(buf, deadline)
		if f == nil {
			return got
		}
		if a.answerARP(f, ip) {
			continue
		}
		// Ethernet, IPv4 from src, ICMP echo reply (type 0).
		if len(f) >= 14+20+8 && binary.BigEndian.Uint16(f[12:]) == etherIPv4 && f[14+9] == 1 &&
			netip.AddrFrom4([4]byte(f[14+12:14+16])) == src && f[14+int(f[14]&0xf)*4] == 0 {
			got++
		}
	}
	return got
}
