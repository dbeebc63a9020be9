package netplane

import (
	"context"
	"fmt"
	"net"
	"testing"

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
