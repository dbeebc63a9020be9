package netplane

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestNeighbourBound: a VM that sends to every address of a LAN the host
// is on makes the host resolve at most its port's burst and rate of next
// hops, not one per address (252 before the bound); the refused
// connections are counted, and another VM still reaches the LAN.
func TestNeighbourBound(t *testing.T) {
	needRoot(t)
	host := testutil.NewNS(t, "nb-host")
	w := wan(t, host)
	n := testNet("nb", api.ModeShared, "10.200.12.0/24")
	start(t, host, n, Options{StateDir: t.TempDir(), Upstreams: []string{wanPeer + ":53"}})
	a := vm(t, host, "nba", "52:55:55:00:0c:01", n.Bridge(), false)
	b := vm(t, host, "nbb", "52:55:55:00:0c:02", n.Bridge(), false)
	mustUdhcpc(t, a, "")
	mustUdhcpc(t, b, "")

	lan := netip.MustParsePrefix(wanHost + "/24").Masked()
	begin := time.Now()
	sent := 0
	a.MustDo(t, func() error {
		c, err := net.ListenUDP("udp4", nil)
		if err != nil {
			return err
		}
		defer c.Close()
		for ip := lan.Addr().Next().Next().Next(); lan.Contains(ip.Next()); ip = ip.Next() { // .3 to .254
			c.WriteToUDPAddrPort([]byte("sweep"), netip.AddrPortFrom(ip, 9))
			sent++
		}
		return nil
	})
	elapsed := time.Since(begin)
	// The port's burst, its rate for as long as the sweep took, and the
	// WAN peer's entry.
	most := 32 + 2*int(elapsed.Seconds()+1) + 1
	var limited uint64
	entries := 0
	testutil.Eventually(t, 10*time.Second, func() error {
		host.MustDo(t, func() error { limited = neighLimited(context.Background(), n.ID); return nil })
		entries = 0
		for _, line := range strings.Split(host.MustRun(t, "ip", "-4", "neigh", "show", "dev", "uplink"), "\n") {
			if strings.TrimSpace(line) != "" {
				entries++
			}
		}
		if limited == 0 && entries <= most {
			return fmt.Errorf("no connection counted as limited, %d neighbours", entries)
		}
		return nil
	}, "the sweep to be limited or to make its neighbour entries")
	if entries > most {
		t.Errorf("a sweep of %d addresses of the LAN made the host resolve %d neighbours, want at most %d", sent, entries, most)
	}
	if limited < uint64(sent-most) {
		t.Errorf("%d connections counted as limited, want at least %d", limited, sent-most)
	}
	// The other VM still reaches the LAN.
	addr, _ := tcpServer(t, w)
	if err := dial(b, addr, 5*time.Second); err != nil {
		t.Errorf("another VM cannot reach the LAN after the sweep: %v", err)
	}
}

// TestNamedCountersNoTable: the counters of a table that does not exist
// are none, not an error (a network whose table a repair is making again).
func TestNamedCountersNoTable(t *testing.T) {
	needRoot(t)
	host := testutil.NewNS(t, "nc-host")
	host.MustDo(t, func() error {
		c, err := namedCounters(context.Background(), "bridge", "nosuch", "")
		if err != nil || len(c) != 0 {
			return fmt.Errorf("namedCounters of a missing table = %v, %v; want none", c, err)
		}
		return nil
	})
}
