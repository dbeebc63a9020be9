package overlay

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/tun"

	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/overlay/overlaytest"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// smallBatch hands out what its reader read, in order, wgBatch at a time,
// each packet whole at the caller's offset with its endpoint; the reader
// is asked again only once all are out.
func TestWireGuardSmallBatch(t *testing.T) {
	const batch, offset = 128, 16
	b := newSmallBatch(batch, 2, offset+1500)
	reads, sent := 0, 0
	reader := func(bufs [][]byte, sizes []int, eps []conn.Endpoint) (int, error) {
		if len(bufs) != batch {
			t.Fatalf("the reader got %d buffers, want %d", len(bufs), batch)
		}
		reads++
		n := []int{100, 3}[(reads-1)%2]
		for i := range n {
			p := bytes.Repeat([]byte{byte(sent)}, 1+sent%1400)
			sizes[i] = copy(bufs[i][offset:], p)
			eps[i] = &conn.StdNetEndpoint{}
			sent++
		}
		return n, nil
	}
	got := 0
	for got < 206 {
		bufs := make([][]byte, wgBatch)
		for i := range bufs {
			bufs[i] = make([]byte, 65536)
		}
		sizes, eps := make([]int, wgBatch), make([]conn.Endpoint, wgBatch)
		n, err := b.read(bufs, sizes, eps, offset, reader)
		if err != nil || n == 0 || n > wgBatch {
			t.Fatalf("read = %d, %v", n, err)
		}
		for i := range n {
			want := bytes.Repeat([]byte{byte(got)}, 1+got%1400)
			if !bytes.Equal(bufs[i][offset:offset+sizes[i]], want) || eps[i] == nil {
				t.Fatalf("packet %d: %d bytes, want %d of %d (endpoint %v)", got, sizes[i], len(want), byte(got), eps[i])
			}
			got++
		}
	}
	if reads != 4 {
		t.Errorf("the reader was asked %d times for 206 packets in batches of 100 and 3, want 4", reads)
	}

	// A count with an error (a TUN's tun.ErrTooManySegments): the caller
	// gets its buffers' worth and the error, then the rest.
	b = newSmallBatch(batch, 0, offset+1500)
	tooMany := errors.New("too many segments")
	reader = func(bufs [][]byte, sizes []int, eps []conn.Endpoint) (int, error) {
		for i := range 40 {
			sizes[i] = copy(bufs[i][offset:], []byte{byte(i)})
		}
		return 40, tooMany
	}
	bufs := make([][]byte, wgBatch)
	for i := range bufs {
		bufs[i] = make([]byte, 65536)
	}
	sizes := make([]int, wgBatch)
	if n, err := b.read(bufs, sizes, nil, offset, reader); n != wgBatch || err != tooMany {
		t.Fatalf("read with an error = %d, %v; want %d, the error", n, err, wgBatch)
	}
	if n, err := b.read(bufs, sizes, nil, offset, reader); n != wgBatch || err != nil || bufs[0][offset] != wgBatch {
		t.Fatalf("read after = %d, %v, first packet %d; want %d, no error, packet %d", n, err, bufs[0][offset], wgBatch, wgBatch)
	}
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// An idle userspace WireGuard device holds a few MB of heap (wgBatch), not
// the 27 MB of wireguard-go's own batches.
func TestWireGuardDeviceHeap(t *testing.T) {
	testutil.RequireRoot(t, "creates network namespaces")
	testutil.RequireCommands(t, "ip")
	dir, n := overlaytest.WireGuardHostOne(t)
	host, _ := overlaytest.Lab(t, "wgheap", "10.77.0.1/24")
	hostnet.SetOwnerDir(dir)
	t.Cleanup(func() { host.Do(func() error { CloseWireGuard(n.ID); return nil }) })
	before := heapInUse()
	host.MustDo(t, func() error { return ensureWireGuard(n) })
	// Its loops take their buffers as they start: at least the TUN
	// reader's wgBatch of 64 KiB.
	testutil.Eventually(t, 5*time.Second, func() error {
		if d := heapInUse() - before; d < wgBatch*65536 {
			return fmt.Errorf("%d bytes so far", d)
		}
		return nil
	}, "the device's loops to start")
	d := heapInUse() - before
	t.Logf("an idle device: %.1f MB of heap", float64(d)/1e6)
	if d > 8e6 {
		t.Errorf("an idle WireGuard device holds %.1f MB of heap, want under 8", float64(d)/1e6)
	}
}

// TestWireGuardSteadyTUN: wireguard-go sees none of the TUN's events (up,
// down, MTU), which it would act on in whatever namespace its reader's
// thread is; the events end when the TUN's do.
func TestWireGuardSteadyTUN(t *testing.T) {
	inner := &eventTUN{events: make(chan tun.Event)}
	s := steadyTUN(inner)
	go func() {
		for _, e := range []tun.Event{tun.EventUp, tun.EventMTUUpdate, tun.EventDown, tun.EventUp | tun.EventMTUUpdate} {
			inner.events <- e
		}
		close(inner.events)
	}()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case e, ok := <-s.Events():
			if !ok {
				return
			}
			t.Errorf("wireguard-go got the event %d", e)
		case <-deadline:
			t.Fatalf("the events did not end with the TUN's")
		}
	}
}

// eventTUN is a tun.Device that only sends events.
type eventTUN struct {
	tun.Device
	events chan tun.Event
}

func (e *eventTUN) Events() <-chan tun.Event { return e.events }
