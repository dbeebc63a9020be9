package e2e

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/test/e2e/guest"
)

// peerPort is where each guest of TestNetworkSocket serves the other.
const peerPort = 7300

// TestNetworkSocket: two qemu guests connect to one network's stream
// socket (`socket: true`, socket_vmnet's way: qemu -netdev stream on the
// same path), each gets a port of its own, its reserved lease, its
// gateway and the other guest, over TCP both ways.
func TestNetworkSocket(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.MustVmnetctl("network", "create", "jumbo")
	sock := filepath.Join(w.StateDir(), "networks", "jumbo.sock")
	boot := func(name, mac, peer string) *guest.Guest {
		return guest.Boot(t, guest.Config{
			Name:  name,
			Netns: w.Name,
			NetArgs: []string{"-netdev", "stream,id=net0,server=off,addr.type=unix,addr.path=" + sock,
				"-device", "virtio-net-pci,netdev=net0,mac=" + mac},
			// Each serves, reaches the other, and waits to be reached:
			// neither powers off before both are done.
			Script: guest.NewScript().DHCP("eth0").Ping(jumboGW).Listen(peerPort).
				Echo(peer, peerPort, "from-"+name, time.Minute).
				AwaitConns(peerPort, 1, time.Minute),
		})
	}
	p := boot("p", "52:55:55:e3:00:01", "10.63.0.202")
	q := boot("q", "52:55:55:e3:00:02", "10.63.0.201")
	rp, rq := p.MustWait(t), q.MustWait(t)
	for _, c := range []struct {
		r  *guest.Result
		ip string
	}{{rp, "10.63.0.201"}, {rq, "10.63.0.202"}} {
		c.r.Expect(t, "eth0.dhcp", "ok")
		c.r.Expect(t, "eth0.ip", c.ip)
		c.r.Expect(t, guest.PingKey(jumboGW), "ok")
		c.r.Expect(t, guest.ListenKey(peerPort)+".conns", "1")
	}
	rp.Expect(t, guest.EchoKey("10.63.0.202", peerPort), "ok")
	rq.Expect(t, guest.EchoKey("10.63.0.201", peerPort), "ok")
	t.Logf("p: boot %v, run %v; q: boot %v, run %v", rp.BootTime.Round(time.Millisecond), rp.Elapsed.Round(time.Millisecond),
		rq.BootTime.Round(time.Millisecond), rq.Elapsed.Round(time.Millisecond))
}
