package doctor

import (
	"context"
	"strings"
	"testing"

	"golang.zx2c4.com/wireguard/tun"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// An encrypted segment: its WireGuard port taken by another program here
// is a failure whose fix names the port's key; free, OK with this host's
// tunnel address.
func TestDoctorWireGuard(t *testing.T) {
	testutil.RequireRoot(t, "creates network namespaces")
	nets := loadNets(t, "networks:\n  lab:\n    mode: shared\n    gateway: 10.95.0.1\n    netmask: 255.255.255.0\n"+
		"    vxlan: {vni: 7, wireguard: {port: 51999, subnet: 10.255.9.0/24}, hosts: [{name: a, address: 10.77.9.1, publicKey: \"AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=\"}, {name: b, address: 10.77.9.2, publicKey: \"AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI=\"}]}\n")
	ns := testutil.NewNS(t, "docwg")
	ns.MustRun(t, "ip", "link", "add", "ul0", "type", "veth", "peer", "name", "ul1")
	ns.MustRun(t, "ip", "addr", "add", "10.77.9.2/24", "dev", "ul0")
	run := func() Finding {
		var f Finding
		if err := ns.Do(func() error { f = one(t, checkWireGuard(context.Background(), nets), "WireGuard of lab"); return nil }); err != nil {
			t.Fatal(err)
		}
		return f
	}
	if f := run(); f.Status != OK || !strings.Contains(f.Detail, "tunnel address is 10.255.9.2; UDP port 51999 is free") {
		t.Errorf("port free: %+v", f)
	}
	taken := ns.ListenPacket(t, "udp", ":51999")
	if f := run(); f.Status != Fail || !strings.Contains(f.Fix, "networks.lab.vxlan.wireguard.port") {
		t.Errorf("port taken: %+v", f)
	}
	taken.Close()

	// The device there and nothing on its port (the controller could not
	// take it): a failure. The port held by a process without the device:
	// taken. Held by the process that runs the device: OK.
	dev := api.WireGuardName("lab")
	ns.MustRun(t, "ip", "tuntap", "add", dev, "mode", "tun")
	if f := run(); f.Status != Fail || !strings.Contains(f.Detail, "nothing listens on its UDP port 51999") {
		t.Errorf("device without a listener: %+v", f)
	}
	taken = ns.ListenPacket(t, "udp", ":51999")
	if f := run(); f.Status != Fail || !strings.Contains(f.Detail, "is taken by another program") || !strings.Contains(f.Fix, "networks.lab.vxlan.wireguard.port") {
		t.Errorf("device, and its port another process's: %+v", f)
	}
	ns.MustRun(t, "ip", "tuntap", "del", dev, "mode", "tun")
	var tn tun.Device
	if err := ns.Do(func() error {
		var err error
		tn, err = tun.CreateTUN(dev, 1400)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer tn.Close()
	if f := run(); f.Status != OK || !strings.Contains(f.Detail, "is its device's") {
		t.Errorf("device and its port one process's: %+v", f)
	}
	taken.Close()
}
