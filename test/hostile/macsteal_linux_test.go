package hostile

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"

	"github.com/vmnetctl/vmnetctl/test/simvm"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// Every port of these learns its MAC (none is pinned): the victim's is
// derived from its name, which anyone can compute.
const macStealVMs = `
vms:
  victim:
    networks: [{vmnet: isolated}]
  early:
    networks: [{vmnet: isolated}]
  late:
    networks: [{vmnet: isolated}]
`

// TestMACSteal: a hostile VM whose port learns its MAC sends its first
// frames from the victim's (derived, predictable) MAC, to take the
// victim's lease and its place in the bridge: before the victim's VMM sent
// anything (the controller claimed the MAC for the victim's port when it
// started the helpers), and after the victim leased an address. Each
// frame is dropped and counted; the attacker gets no DHCP answer; the
// victim keeps its lease, its forwarding entry and its gateway; the
// attacker's port still learns a MAC of its own.
func TestMACSteal(t *testing.T) {
	h := simvm.NewHost(t, "vmnm", networksYAML, "bridge")
	h.MustVmnetctl("up", "-f", h.WriteFile("vms.yaml", macStealVMs))
	st := h.Status()
	s := &scene{t: t, h: h, st: st, network: "isolated", gateway: netip.MustParseAddr("10.82.0.1")}
	va := s.attachment("victim")
	vmac := mustMAC(va.MAC)
	drops := func(vm string) uint64 {
		for _, a := range h.Status().Attachments {
			if a.VM == vm {
				return a.SpoofDrops
			}
		}
		return 0
	}
	// steal has vm's port, which has sent nothing yet, try the victim's
	// MAC: DHCP, then a gratuitous ARP and a RELEASE of ip.
	steal := func(vm string, ip netip.Addr) *attacker {
		aa := s.attachment(vm)
		a := newAttacker(t, vmac, aa.Socket, filepath.Join(h.Dir, vm+".sock"))
		for range 3 {
			disc, _ := dhcpv4.NewDiscovery(vmac)
			if off := a.dhcp(vmac, disc); off != nil {
				t.Errorf("%s, as the victim %s: DHCP answered %v", vm, vmac, off)
			}
		}
		sent := uint64(3)
		if ip.IsValid() {
			zero := net.HardwareAddr{0, 0, 0, 0, 0, 0}
			rel, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeRelease), dhcpv4.WithHwAddr(vmac),
				dhcpv4.WithClientIP(net.IP(ip.AsSlice())), dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IP(s.gateway.AsSlice()))))
			for range 3 {
				a.send(ether(broadcastMAC, vmac, etherARP, arp(2, vmac, ip, zero, ip)))
				a.send(ether(broadcastMAC, vmac, etherIPv4, ipv4UDP(ip, s.gateway, 68, 67, rel.ToBytes())))
			}
			sent += 6
		}
		// The DHCP exchanges waited for answers: the frames went
		// through the helper, and the bridge would have learned.
		if out := h.MustRun(t, "bridge", "fdb", "show", "dev", aa.Tap); strings.Contains(out, vmac.String()) {
			t.Errorf("the bridge learned the victim's %s on %s's port:\n%s", vmac, vm, out)
		}
		testutil.Eventually(t, 10*time.Second, func() error {
			if d := drops(vm); d < sent {
				return fmt.Errorf("%s: %d frames dropped, want %d", vm, d, sent)
			}
			return nil
		}, "the guard to drop and count %s's frames from the victim's MAC", vm)
		return a
	}

	// Before the victim's VMM is there: its MAC is claimed already.
	early := steal("early", netip.Addr{})
	// The victim comes, leases and reaches its gateway.
	victim := s.vm("victim")
	vip := netip.MustParseAddr(victim.DHCP(t)["ip"])
	if err := victim.Ping(s.gateway.String(), 1); err != nil {
		t.Fatalf("victim cannot reach the gateway: %v", err)
	}
	// After: the auditor's attack, from a port that never sent a frame.
	steal("late", vip)

	if out := h.MustVmnetctl("leases"); !strings.Contains(out, vmac.String()) || !strings.Contains(out, vip.String()) {
		t.Errorf("the victim's lease (%s, %s) is gone:\n%s", vmac, vip, out)
	}
	victimFDB := func() error {
		out := h.MustRun(t, "bridge", "fdb", "show", "br", s.bridge())
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, vmac.String()+" ") && !strings.Contains(l, " dev "+va.Tap+" ") {
				return fmt.Errorf("the victim's MAC on another port: %s", l)
			}
		}
		if !strings.Contains(out, vmac.String()+" dev "+va.Tap+" ") {
			return fmt.Errorf("the victim's MAC %s is not on its port %s:\n%s", vmac, va.Tap, out)
		}
		return nil
	}
	if err := victimFDB(); err != nil {
		t.Error(err)
	}
	if err := victim.Ping(s.gateway.String(), 1); err != nil {
		t.Errorf("victim cannot reach the gateway after the attack: %v", err)
	}
	if err := victimFDB(); err != nil {
		t.Error(err)
	}
	for _, a := range h.Status().Attachments {
		if a.VM != "victim" && containsMAC(a.SeenMACs, vmac) {
			t.Errorf("%s's port was seen with the victim's MAC: %v", a.VM, a.SeenMACs)
		}
	}
	// A helper of its own, pinned to the victim's MAC (as under sudo):
	// refused, with the reason.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := h.VmnetctlCommand(ctx, "helper", "--network", "isolated", "--mac", vmac.String(),
		"--socket", filepath.Join(h.Dir, "thief.sock")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "MAC "+vmac.String()+" is another VM port's (port "+va.Tap+")") {
		t.Errorf("helper --mac %s (the victim's): %v\n%s", vmac, err, out)
	}
	// The attacker's port still learns a MAC nobody claimed: its own.
	early.mac = randomMAC(7)
	if ip := early.lease(); !ip.IsValid() {
		t.Errorf("early, from a MAC of its own: no lease")
	}
	if d := drops("victim"); d != 0 {
		t.Errorf("victim: %d of its own frames dropped", d)
	}
}

func containsMAC(macs []string, mac net.HardwareAddr) bool {
	for _, m := range macs {
		if strings.EqualFold(m, mac.String()) {
			return true
		}
	}
	return false
}
