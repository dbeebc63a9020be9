package shaper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// lab is a port p in namespace host whose other end is eth0 at 10.99.0.2
// in namespace vm (the VM), p at 10.99.0.1.
func lab(t *testing.T, label string) (host, vm *testutil.NS) {
	t.Helper()
	testutil.RequireRoot(t, "changes qdiscs in network namespaces")
	host, vm = testutil.NewNS(t, label+"-host"), testutil.NewNS(t, label+"-vm")
	testutil.Run(t, "ip", "-n", host.Name, "link", "add", "p", "type", "veth", "peer", "name", "eth0", "netns", vm.Name)
	host.MustRun(t, "ip", "addr", "add", "10.99.0.1/24", "dev", "p")
	host.MustRun(t, "ip", "link", "set", "p", "up")
	vm.MustRun(t, "ip", "addr", "add", "10.99.0.2/24", "dev", "eth0")
	vm.MustRun(t, "ip", "link", "set", "eth0", "up")
	return host, vm
}

// TestSet: Set puts the limits on the port (a token bucket to the VM, a
// redirect to a marked IFB device shaped from it), as Get reads them
// back and tc shows them; setting them again changes nothing; a change
// replaces them; nil removes both, the IFB device too.
func TestSet(t *testing.T) {
	host, vm := lab(t, "sh")
	set := func(b *api.Bandwidth) *api.Bandwidth {
		t.Helper()
		var got *api.Bandwidth
		host.MustDo(t, func() (err error) {
			if err := Set("p", b); err != nil {
				return err
			}
			got, err = Get("p")
			return err
		})
		return got
	}
	// The kernel keeps a burst as the time it takes at the rate: read
	// back, it is within a few bytes.
	same := func(got *api.Bandwidth, want api.Bandwidth) bool {
		return got != nil && got.ToVM == want.ToVM && got.FromVM == want.FromVM &&
			got.Burst <= want.Burst && got.Burst >= want.Burst-want.Burst/1000
	}
	b := &api.Bandwidth{ToVM: 20_000_000, FromVM: 10_000_000}
	want := api.Bandwidth{ToVM: 20_000_000, FromVM: 10_000_000, Burst: b.BurstFor(20_000_000)}
	if got := set(b); !same(got, want) {
		t.Fatalf("after Set: %+v, want %+v", got, want)
	}
	qdiscs := host.MustRun(t, "tc", "qdisc", "show", "dev", "p")
	if !strings.Contains(qdiscs, "tbf 1: root") || !strings.Contains(qdiscs, "ingress ffff:") {
		t.Errorf("tc shows:\n%s", qdiscs)
	}
	ifb := api.ShaperName("p")
	if filters := host.MustRun(t, "tc", "filter", "show", "dev", "p", "ingress"); !strings.Contains(filters, "u32") || !strings.Contains(filters, "Redirect to device "+ifb) {
		t.Errorf("the ingress filters:\n%s", filters)
	}
	if link := host.MustRun(t, "ip", "-d", "link", "show", ifb); !strings.Contains(link, "alias vmnetctl:shaper=p") || !strings.Contains(link, "ifb") {
		t.Errorf("the IFB device:\n%s", link)
	}
	if got := set(b); !same(got, want) {
		t.Errorf("after Set again: %+v", got)
	}
	if filters := host.MustRun(t, "tc", "filter", "show", "dev", "p", "ingress"); strings.Count(filters, "Redirect") != 1 {
		t.Errorf("two Sets left these filters:\n%s", filters)
	}
	// The IFB device deleted behind vmnetctl's back: Set makes it again,
	// and the redirect to the one gone goes, or the kernel would drop
	// every frame from the VM.
	host.MustRun(t, "ip", "link", "del", ifb)
	if got := set(b); !same(got, want) {
		t.Errorf("after the IFB device was deleted, Set again: %+v", got)
	}
	if filters := host.MustRun(t, "tc", "filter", "show", "dev", "p", "ingress"); strings.Count(filters, "Redirect") != 1 {
		t.Errorf("after the IFB device was made again, the redirects:\n%s", filters)
	}
	if err := vm.Ping("10.99.0.1", 1); err != nil {
		t.Errorf("the VM's frames after the IFB device was made again: %v", err)
	}
	b2 := &api.Bandwidth{ToVM: 5_000_000, Burst: 256 << 10}
	if got := set(b2); !same(got, *b2) {
		t.Errorf("after a change: %+v, want %+v", got, b2)
	}
	if got := set(nil); got != nil {
		t.Errorf("after Set(nil): %+v", got)
	}
	if qdiscs := host.MustRun(t, "tc", "qdisc", "show", "dev", "p"); strings.Contains(qdiscs, "tbf") || strings.Contains(qdiscs, "ingress") {
		t.Errorf("after Set(nil), tc shows:\n%s", qdiscs)
	}
	if out, err := host.Run(context.Background(), "ip", "link", "show", ifb); err == nil {
		t.Errorf("after Set(nil), the IFB device is left:\n%s", out)
	}
}

// TestLimitsHold: TCP through a limited port, one stream or eight, never
// goes much past its limit in either direction (an upper bound: a busy machine only makes
// it slower), with the port's segmentation offloads on (its 64 KiB
// frames pass the policer and the bucket).
func TestLimitsHold(t *testing.T) {
	host, vm := lab(t, "sl")
	testutil.RequireCommands(t, "iperf3")
	host.MustDo(t, func() error { return Set("p", &api.Bandwidth{ToVM: 20_000_000, FromVM: 10_000_000}) })
	vm.Start(t, filepath.Join(t.TempDir(), "iperf3.log"), "iperf3", "-s", "-B", "10.99.0.2")
	rate := func(args ...string) float64 { return iperfRate(t, host, args...) }
	to, from := rate(), rate("-R")
	to8, from8 := rate("-P", "8"), rate("-R", "-P", "8")
	t.Logf("TCP through the limits: %.1f Mbit/s to the VM (20), %.1f from it (10); eight streams: %.1f and %.1f", to/1e6, from/1e6, to8/1e6, from8/1e6)
	if to8 > 22e6 || from8 > 11e6 {
		t.Errorf("eight streams: %.1f Mbit/s to the VM (limit 20), %.1f from it (limit 10)", to8/1e6, from8/1e6)
	}
	if to > 22e6 {
		t.Errorf("to the VM, limited to 20 Mbit/s: %.1f Mbit/s", to/1e6)
	}
	if from > 11e6 {
		t.Errorf("from the VM, limited to 10 Mbit/s: %.1f Mbit/s", from/1e6)
	}
}

// iperfRate is what iperf3 in host measures to the VM's server (with -R,
// from it), bits per second: its first run that moves data (on a busy
// machine a run may start before the server listens, or move nothing in
// its seconds).
func iperfRate(tb testing.TB, host *testutil.NS, args ...string) float64 {
	tb.Helper()
	var bps float64
	testutil.Eventually(tb, 60*time.Second, func() error {
		out, err := host.Run(context.Background(), "iperf3", append([]string{"-c", "10.99.0.2", "-t", "3", "-J"}, args...)...)
		var r struct {
			Error string `json:"error"`
			End   struct {
				SumReceived struct {
					BitsPerSecond float64 `json:"bits_per_second"`
				} `json:"sum_received"`
			} `json:"end"`
		}
		if jerr := json.Unmarshal([]byte(out), &r); err != nil || jerr != nil || r.Error != "" {
			return fmt.Errorf("iperf3: %v %v %s", err, jerr, r.Error)
		}
		if bps = r.End.SumReceived.BitsPerSecond; bps <= 0 {
			return errors.New("iperf3 moved nothing")
		}
		return nil
	}, "iperf3 %v through the port", args)
	return bps
}

// BenchmarkLimit100 measures how close TCP gets to a 100 Mbit/s limit
// both ways, one stream and eight (issue 33's goal: within 10%), as the
// fraction of the limit that iperf3 received:
//
//	sudo go test ./shaper -run '^$' -bench Limit100 -benchtime 3x
func BenchmarkLimit100(b *testing.B) {
	testutil.RequireRoot(b, "changes qdiscs in network namespaces")
	testutil.RequireCommands(b, "iperf3")
	host, vm := testutil.NewNS(b, "bl-host"), testutil.NewNS(b, "bl-vm")
	testutil.Run(b, "ip", "-n", host.Name, "link", "add", "p", "type", "veth", "peer", "name", "eth0", "netns", vm.Name)
	host.MustRun(b, "ip", "addr", "add", "10.99.0.1/24", "dev", "p")
	host.MustRun(b, "ip", "link", "set", "p", "up")
	vm.MustRun(b, "ip", "addr", "add", "10.99.0.2/24", "dev", "eth0")
	vm.MustRun(b, "ip", "link", "set", "eth0", "up")
	const limit = 100_000_000
	host.MustDo(b, func() error { return Set("p", &api.Bandwidth{ToVM: limit, FromVM: limit}) })
	vm.Start(b, filepath.Join(b.TempDir(), "iperf3.log"), "iperf3", "-s", "-B", "10.99.0.2")
	runs := []struct {
		name string
		args []string
	}{{"to-1", nil}, {"from-1", []string{"-R"}}, {"to-8", []string{"-P", "8"}}, {"from-8", []string{"-R", "-P", "8"}}}
	sums := make([]float64, len(runs))
	for range b.N {
		for i, r := range runs {
			sums[i] += iperfRate(b, host, r.args...)
		}
	}
	for i, r := range runs {
		b.ReportMetric(sums[i]/float64(b.N)/limit, "of-limit-"+r.name)
	}
}

// meter is what a receiver got of one TCP stream: the bytes by the time
// each read returned.
type meter struct {
	mu      sync.Mutex
	times   []time.Time
	total   []int64
	stopped atomic.Bool
}

func (m *meter) snapshot() ([]time.Time, []int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.times), slices.Clone(m.total)
}

// received is the bytes received so far.
func (m *meter) received() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.total) == 0 {
		return 0
	}
	return m.total[len(m.total)-1]
}

// stream sends size bytes (forever for 0) from namespace from to a
// receiver in namespace to at addr, over one TCP connection, as fast as
// the port lets it, and meters what arrives.
func stream(t *testing.T, from, to *testutil.NS, addr string, size int64) *meter {
	t.Helper()
	ln := to.Listen(t, "tcp4", addr)
	m := &meter{}
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 64<<10)
		var n int64
		for {
			k, err := c.Read(buf)
			n += int64(k)
			m.mu.Lock()
			m.times, m.total = append(m.times, time.Now()), append(m.total, n)
			m.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	var c net.Conn
	from.MustDo(t, func() (err error) { c, err = net.Dial("tcp4", addr); return err })
	t.Cleanup(func() { m.stopped.Store(true); c.Close() })
	go func() {
		buf := make([]byte, 64<<10)
		for sent := int64(0); size == 0 || sent < size; sent += int64(len(buf)) {
			if m.stopped.Load() {
				return
			}
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
		c.(*net.TCPConn).CloseWrite()
	}()
	return m
}

// overBucket is the first sample of m from start on that got more than a
// token bucket of rate bits per second and burst bytes lets through
// since start (plus slack: what was in flight), as text; "" for none.
func overBucket(m *meter, start time.Time, base int64, rate, burst, slack uint64) string {
	times, total := m.snapshot()
	for i, at := range times {
		if at.Before(start) {
			continue
		}
		allowed := float64(burst+slack) + float64(rate)/8*at.Sub(start).Seconds()
		if got := float64(total[i] - base); got > allowed {
			return fmt.Sprintf("%.0f bytes %v after the start, where the bucket lets %.0f through", got, at.Sub(start).Round(time.Millisecond), allowed)
		}
	}
	return ""
}

// TestBurstAsDeclared: after a quiet while, a stream gets the declared
// burst at once and then the rate, never more, both ways: what arrives
// by any instant is at most the burst and the rate's bytes since the
// first one (an upper bound: a busy machine only makes it less).
func TestBurstAsDeclared(t *testing.T) {
	host, vm := lab(t, "sb")
	const rate, burst = 10_000_000, 1 << 20
	host.MustDo(t, func() error { return Set("p", &api.Bandwidth{ToVM: rate, FromVM: rate, Burst: burst}) })
	for _, c := range []struct {
		dir      string
		from, to *testutil.NS
		addr     string
	}{{"to the VM", host, vm, "10.99.0.2:7001"}, {"from the VM", vm, host, "10.99.0.1:7002"}} {
		const size = 3 * burst
		m := stream(t, c.from, c.to, c.addr, size)
		testutil.Eventually(t, 2*time.Minute, func() error {
			if got := m.received(); got < size {
				return fmt.Errorf("%d of %d bytes", got, size)
			}
			return nil
		}, "the stream %s", c.dir)
		times, total := m.snapshot()
		start := times[0]
		// (slack: the first read's bytes, and a 64 KiB frame the bucket
		// lets through whole.)
		if over := overBucket(m, start, 0, rate, burst, uint64(total[0])+128<<10); over != "" {
			t.Errorf("%s, limit 10 Mbit/s with a burst of 1 MiB: %s", c.dir, over)
		}
		i, _ := slices.BinarySearch(total, burst)
		t.Logf("%s: the burst's 1 MiB arrived in %v (at the rate: 839ms), all 3 MiB in %v (at the rate after the burst: 1.68s)",
			c.dir, times[min(i, len(times)-1)].Sub(start).Round(time.Millisecond), times[len(times)-1].Sub(start).Round(time.Millisecond))
	}
}

// TestLimitChangedLive: a limit lowered while a stream runs holds for
// that stream at once, on the same connection (no reconnect): from the
// change on, what arrives is at most the new rate's bytes, its burst and
// what was already queued at the old rate.
func TestLimitChangedLive(t *testing.T) {
	host, vm := lab(t, "sv")
	host.MustDo(t, func() error { return Set("p", &api.Bandwidth{ToVM: 40_000_000}) })
	m := stream(t, host, vm, "10.99.0.2:7003", 0)
	testutil.Eventually(t, 2*time.Minute, func() error {
		if got := m.received(); got < 4<<20 {
			return fmt.Errorf("%d bytes", got)
		}
		return nil
	}, "the stream at 40 Mbit/s")
	const lower = 4_000_000
	b := &api.Bandwidth{ToVM: lower}
	host.MustDo(t, func() error { return Set("p", b) })
	changed, base := time.Now(), m.received()
	// At least 2 s of the new rate's bytes after the change: the stream
	// goes on (the same connection) and is metered all along.
	testutil.Eventually(t, 2*time.Minute, func() error {
		if got := m.received() - base; got < 2*lower/8 {
			return fmt.Errorf("%d bytes since the change", got)
		}
		return nil
	}, "the stream after the change")
	// slack: what the old rate's bucket had queued (tbf's queue at the
	// kernel default, and the socket's bytes in flight).
	if over := overBucket(m, changed, base, lower, b.BurstFor(lower), 512<<10); over != "" {
		t.Errorf("after the limit went from 40 to 4 Mbit/s: %s", over)
	}
}

// TestQdiscAt: the one qdisc asked for is read as a dump would show it
// (kind, handle, a token bucket's rate, limit and buffer, a rate above
// 32 bits too): a veth's built-in noqueue root; no ingress before one is
// added, nor once it is removed (the kernel's noop in its place).
func TestQdiscAt(t *testing.T) {
	host, _ := lab(t, "qa")
	host.MustDo(t, func() error {
		l, err := netlink.LinkByName("p")
		if err != nil {
			return err
		}
		if q, err := qdiscAt(l, netlink.HANDLE_ROOT); err != nil || q.kind != "noqueue" || q.tbf != nil {
			return fmt.Errorf("qdiscAt(root) of a bare veth: %+v, %v; want its noqueue", q, err)
		}
		if q, err := qdiscAt(l, netlink.HANDLE_INGRESS); err != nil || q.kind != "" {
			return fmt.Errorf("qdiscAt(ingress) of a bare veth: %+v, %v; want none", q, err)
		}
		for _, rate := range []uint64{20_000_000, 40_000_000_000} {
			b := &api.Bandwidth{ToVM: rate}
			want := tbf(l.Attrs().Index, rate, b)
			if err := netlink.QdiscReplace(want); err != nil {
				return err
			}
			got, err := rootTbf(l)
			if err != nil || got == nil {
				return fmt.Errorf("rootTbf at %d bit/s: %v, %v", rate, got, err)
			}
			if got.Rate != want.Rate || got.Limit != want.Limit || got.Buffer != want.Buffer || got.Handle != want.Handle {
				return fmt.Errorf("rootTbf at %d bit/s: rate %d limit %d buffer %d handle %x, want %d %d %d %x",
					rate, got.Rate, got.Limit, got.Buffer, got.Handle, want.Rate, want.Limit, want.Buffer, want.Handle)
			}
		}
		in := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: ingressHandle, Parent: netlink.HANDLE_INGRESS}}
		if err := netlink.QdiscAdd(in); err != nil {
			return err
		}
		if q, err := qdiscAt(l, netlink.HANDLE_INGRESS); err != nil || q.kind != "ingress" || q.handle != ingressHandle {
			return fmt.Errorf("qdiscAt(ingress) with one: %+v, %v", q, err)
		}
		if err := removeIngress(l); err != nil {
			return err
		}
		if q, err := qdiscAt(l, netlink.HANDLE_INGRESS); err != nil || q.kind != "" {
			return fmt.Errorf("qdiscAt(ingress) once removed: %+v, %v; want none", q, err)
		}
		return nil
	})
}
