package netplane

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/guard"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// BenchmarkCreatePort measures a VM's TAP made (guarded, on the bridge,
// up) and closed with 0 and 900 ports on its bridge already, as an
// attach's start step makes it (the controller's guard layout kept), for
// a VM whose MAC its guard learns and one whose VM file pins it.
// Its close, the TAP's unregister (an RCU grace period or two), is not
// timed: the relay's exit pays it, off an attach's path.
func BenchmarkCreatePort(b *testing.B) {
	for _, bc := range []struct {
		held   int
		pinned bool
	}{{0, false}, {900, false}, {0, true}, {900, true}} {
		held := bc.held
		b.Run(fmt.Sprintf("ports=%d/pinned=%v", held, bc.pinned), func(b *testing.B) {
			host := testutil.NewNS(b, "bp")
			n := testNet("bp", api.ModeShared, "10.200.12.0/22")
			var nw *Network
			host.MustDo(b, func() error {
				var err error
				nw, err = Start(context.Background(), n, Options{StateDir: b.TempDir(), Upstreams: []string{"127.0.0.1:53"}})
				return err
			})
			defer nw.Close()
			// As a controller's: its owner, the port learning its VM's MAC.
			hostnet.SetOwner(b.TempDir())
			defer hostnet.SetOwner("")
			// Or, pinned, given the MAC its VM file sets (as lima's do).
			mac := 0
			cfg := func(i int) PortConfig {
				c := PortConfig{Name: fmt.Sprintf("vmt-b%d", i), UID: -1, GID: -1, GuardKept: true}
				if bc.pinned {
					mac++
					c.VMMAC = net.HardwareAddr{0x52, 0x55, 0, 0, byte(mac >> 8), byte(mac)}
				}
				return c
			}
			host.MustDo(b, func() error {
				for i := range held {
					p, err := CreatePort(n, cfg(i))
					if err != nil {
						return err
					}
					defer p.Close()
				}
				b.ResetTimer()
				for b.Loop() {
					c := cfg(held)
					p, err := CreatePort(n, c)
					if err != nil {
						return err
					}
					// Its guard goes too, as a controller's pass prunes it.
					b.StopTimer()
					if err := guard.RemovePort(context.Background(), n, c.Name); err != nil {
						return err
					}
					p.Close()
					b.StartTimer()
				}
				b.StopTimer()
				return nil
			})
		})
	}
}

// TestCreatePortQuiet: the link notices a VM's port makes as it is made,
// on a network that isolates its ports and on one that does not, are none
// the controller's watch takes for drift (linkChanged: each would start a
// pass that reads every port, one an attach). The notices are read up to
// a sentinel link's deletion, made after the ports: none is missed.
func TestCreatePortQuiet(t *testing.T) {
	needRoot(t)
	host := testutil.NewNS(t, "pq")
	open := testNet("pq1", api.ModeShared, "10.200.15.0/24")
	iso := testNet("pq2", api.ModeHost, "10.200.16.0/24")
	iso.Isolation = true
	start(t, host, open, Options{StateDir: t.TempDir()})
	start(t, host, iso, Options{StateDir: t.TempDir()})
	updates := make(chan netlink.LinkUpdate, 256)
	done := make(chan struct{})
	defer close(done)
	host.MustDo(t, func() error { return netlink.LinkSubscribe(updates, done) })
	names := map[int]string{}
	host.MustDo(t, func() error {
		for i, n := range []*api.Network{open, iso} {
			br, err := NetworkBridge(n)
			if err != nil {
				return err
			}
			names[br.Attrs().Index] = br.Attrs().Name
			p, err := CreatePort(n, PortConfig{Name: fmt.Sprintf("vmt-pq%d", i), UID: -1, GID: -1, GuardKept: true, Isolated: n.Isolation})
			if err != nil {
				return err
			}
			defer p.Close()
		}
		return nil
	})
	host.MustRun(t, "ip", "link", "add", "pq-sentinel", "type", "veth", "peer", "name", "pq-sentinel1")
	host.MustRun(t, "ip", "link", "del", "pq-sentinel")
	seen := 0
	for {
		select {
		case u := <-updates:
			a := u.Link.Attrs()
			if a.Name == "pq-sentinel" && u.Header.Type == unix.RTM_DELLINK {
				if seen == 0 {
					t.Fatal("no notice of the ports (the test cannot see them)")
				}
				return
			}
			if strings.HasPrefix(a.Name, "vmt-pq") {
				seen++
				if linkChanged(u, func(i int) string { return names[i] }) {
					t.Errorf("making port %s: a notice taken for drift (type %d, master %d, flags %v, protinfo %+v)", a.Name, u.Header.Type, a.MasterIndex, a.Flags, a.Protinfo)
				}
			}
		case <-time.After(30 * time.Second):
			t.Fatal("no notice of the sentinel's deletion")
		}
	}
}
