package capture

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"
	"golang.org/x/net/bpf"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/nettypes"
	"github.com/vmnetctl/vmnetctl/shaper"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestPort: a capture of a port holds the pings that crossed it, each on
// the interface of its direction (the echo requests from the VM, the
// replies to it), named after the capture's name, and reads as pcapng
// with gopacket's reader; it ends after Count frames.
func TestPort(t *testing.T) {
	testutil.RequireRoot(t, "captures in a network namespace")
	host, vm := portLab(t, "cp", "10.98.0")
	var out bytes.Buffer
	st := captureUntilEnd(t, host, nettypes.CaptureOptions{Name: "web/0 on shared", Count: 6}, &out, func() {
		vm.Run(context.Background(), "ping", "-c", "1", "-W", "1", "10.98.0.1")
	}, "six frames captured")
	if st.Frames != 6 {
		t.Errorf("stats %+v, want 6 frames", st)
	}
	r, err := pcapgo.NewNgReader(&out, pcapgo.DefaultNgReaderOptions)
	if err != nil {
		t.Fatal(err)
	}
	var requests, replies int
	var perIface [2]uint64
	for {
		data, ci, err := r.ReadPacketData()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		perIface[ci.InterfaceIndex]++
		icmp, _ := gopacket.NewPacket(data, layers.LayerTypeEthernet, gopacket.Default).Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4)
		switch {
		case icmp == nil:
		case icmp.TypeCode.Type() == layers.ICMPv4TypeEchoRequest && ci.InterfaceIndex == 0:
			requests++
		case icmp.TypeCode.Type() == layers.ICMPv4TypeEchoReply && ci.InterfaceIndex == 1:
			replies++
		default:
			t.Errorf("ICMP %v on interface %d", icmp.TypeCode, ci.InterfaceIndex)
		}
	}
	if requests == 0 || replies == 0 {
		t.Errorf("%d echo requests from the VM, %d replies to it", requests, replies)
	}
	for i, want := range []string{"web/0 on shared: from the VM", "web/0 on shared: to the VM"} {
		in, err := r.Interface(i)
		if err != nil || in.Name != want {
			t.Errorf("interface %d: %q (%v), want %q", i, in.Name, err, want)
		}
		if got := in.Statistics.PacketsReceived; got != perIface[i] {
			t.Errorf("interface %d's statistics: %d frames received, and it holds %d", i, got, perIface[i])
		}
	}
}

// TestPortShapedOnce: a port whose VM's frames are shaped through an IFB
// device (shaper: redirected from the port's ingress, and handed back)
// has each of them captured once, not twice.
func TestPortShapedOnce(t *testing.T) {
	testutil.RequireRoot(t, "captures in a network namespace")
	host, vm := portLab(t, "cs", "10.97.0")
	host.MustDo(t, func() error { return shaper.Set("p", &api.Bandwidth{FromVM: 10_000_000}) })
	var out bytes.Buffer
	captureUntilEnd(t, host, nettypes.CaptureOptions{Name: "x", Count: 20}, &out, func() {
		vm.Run(context.Background(), "ping", "-c", "1", "-W", "1", "10.97.0.1")
	}, "twenty frames captured")
	r, err := pcapgo.NewNgReader(&out, pcapgo.DefaultNgReaderOptions)
	if err != nil {
		t.Fatal(err)
	}
	var requests, replies int
	for {
		data, _, err := r.ReadPacketData()
		if err != nil {
			break
		}
		if icmp, ok := gopacket.NewPacket(data, layers.LayerTypeEthernet, gopacket.Default).Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4); ok {
			switch icmp.TypeCode.Type() {
			case layers.ICMPv4TypeEchoRequest:
				requests++
			case layers.ICMPv4TypeEchoReply:
				replies++
			}
		}
	}
	// Each request is answered: twice as many requests as replies would
	// be the shaped ones seen again.
	if requests == 0 || requests > replies+1 {
		t.Errorf("%d echo requests from the VM, %d replies to it: the shaped frames seen twice?", requests, replies)
	}
}

// TestPortFilter: a capture with a filter holds only the frames it
// passes (UDP to port 9999 here, among pings and UDP to another port),
// attached before the socket is bound, so none passes unfiltered.
func TestPortFilter(t *testing.T) {
	testutil.RequireRoot(t, "captures in a network namespace")
	host, vm := portLab(t, "cf", "10.97.0")
	filter, err := bpf.Assemble([]bpf.Instruction{
		bpf.LoadAbsolute{Off: 12, Size: 2}, // the ethertype
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: 0x0800, SkipTrue: 6},
		bpf.LoadAbsolute{Off: 23, Size: 1}, // the IPv4 protocol
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: 17, SkipTrue: 4},
		bpf.LoadMemShift{Off: 14},              // X: the IPv4 header's length
		bpf.LoadIndirect{Off: 14 + 2, Size: 2}, // the UDP destination port
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: 9999, SkipFalse: 1},
		bpf.RetConstant{Val: 1 << 18},
		bpf.RetConstant{Val: 0},
	})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	captureUntilEnd(t, host, nettypes.CaptureOptions{Name: "f", Count: 3, Filter: filter}, &out, func() {
		vm.Run(context.Background(), "ping", "-c", "1", "-W", "1", "10.97.0.1")
		vm.Do(func() error {
			for _, port := range []string{"9998", "9999"} {
				if c, err := net.Dial("udp4", "10.97.0.1:"+port); err == nil {
					c.Write([]byte("x"))
					c.Close()
				}
			}
			return nil
		})
	}, "three frames captured")
	r, err := pcapgo.NewNgReader(&out, pcapgo.DefaultNgReaderOptions)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		data, _, err := r.ReadPacketData()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n++
		udp, _ := gopacket.NewPacket(data, layers.LayerTypeEthernet, gopacket.Default).Layer(layers.LayerTypeUDP).(*layers.UDP)
		if udp == nil || udp.DstPort != 9999 {
			t.Errorf("the filter let through a frame that is not UDP to 9999: %x", data)
		}
	}
	if n != 3 {
		t.Errorf("%d frames in the capture, want 3", n)
	}
}

// TestPortRing: a flight recorder keeps the last frames only, within its
// ring, and writes them when it ends: told to by Until, or when its port
// goes (the helper exited), saying why.
func TestPortRing(t *testing.T) {
	testutil.RequireRoot(t, "captures in a network namespace")
	host, vm := portLab(t, "cr", "10.96.0")
	const ring = 4 << 10
	record := func(until func() string, act func()) (*bytes.Buffer, nettypes.CaptureStats) {
		t.Helper()
		var out bytes.Buffer
		var st nettypes.CaptureStats
		done := make(chan error, 1)
		bound := make(chan struct{})
		go func() {
			done <- host.Do(func() (err error) {
				st, err = Port(context.Background(), "p", nettypes.CaptureOptions{Name: "r", Ring: ring, Until: until, Bound: func() { close(bound) }}, &out)
				return err
			})
		}()
		<-bound
		act()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		return &out, st
	}
	var stop atomic.Bool
	out, st := record(func() string {
		if stop.Load() {
			return "told to"
		}
		return ""
	}, func() {
		if out, err := vm.Run(context.Background(), "ping", "-c", "40", "-i", "0.01", "-s", "200", "10.96.0.1"); err != nil {
			t.Errorf("40 pings: %v\n%s", err, out)
		}
		stop.Store(true)
	})
	if st.Ended != "told to" {
		t.Errorf("ended %q", st.Ended)
	}
	r, err := pcapgo.NewNgReader(out, pcapgo.DefaultNgReaderOptions)
	if err != nil {
		t.Fatal(err)
	}
	frames, size, lastSeq := 0, 0, 0
	for {
		data, _, err := r.ReadPacketData()
		if err != nil {
			break
		}
		frames++
		size += len(data)
		if icmp, ok := gopacket.NewPacket(data, layers.LayerTypeEthernet, gopacket.Default).Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4); ok && icmp.TypeCode.Type() == layers.ICMPv4TypeEchoRequest {
			lastSeq = int(icmp.Seq)
		}
	}
	if frames == 0 || size > ring || uint64(frames) != st.Frames {
		t.Errorf("the ring holds %d frames, %d bytes (ring %d; stats %+v)", frames, size, ring, st)
	}
	if lastSeq != 40 {
		t.Errorf("the last echo request kept is number %d, want 40: the ring keeps the latest", lastSeq)
	}
	// The port goes (its helper exited): what the ring holds is written.
	_, st = record(nil, func() {
		if out, err := vm.Run(context.Background(), "ping", "-c", "1", "10.96.0.1"); err != nil {
			t.Errorf("a ping: %v\n%s", err, out)
		}
		host.MustRun(t, "ip", "link", "del", "p")
	})
	if !strings.Contains(st.Ended, "the port went") || st.Frames == 0 {
		t.Errorf("after the port went: %+v", st)
	}
}

// portLab is a "host" namespace whose port p is a veth to eth0 of a "VM"
// namespace, PREFIX.1 and PREFIX.2 (/24), both up.
func portLab(t *testing.T, label, prefix string) (host, vm *testutil.NS) {
	t.Helper()
	host, vm = testutil.NewNS(t, label+"-host"), testutil.NewNS(t, label+"-vm")
	testutil.Run(t, "ip", "-n", host.Name, "link", "add", "p", "type", "veth", "peer", "name", "eth0", "netns", vm.Name)
	host.MustRun(t, "ip", "addr", "add", prefix+".1/24", "dev", "p")
	host.MustRun(t, "ip", "link", "set", "p", "up")
	vm.MustRun(t, "ip", "addr", "add", prefix+".2/24", "dev", "eth0")
	vm.MustRun(t, "ip", "link", "set", "eth0", "up")
	return host, vm
}

// captureUntilEnd captures port p of host with o into out, calling poke
// (which sends the frames) until the capture ends, and returns its stats:
// it binds as it starts, so the first pokes may come before.
func captureUntilEnd(t *testing.T, host *testutil.NS, o nettypes.CaptureOptions, out io.Writer, poke func(), what string) nettypes.CaptureStats {
	t.Helper()
	var st nettypes.CaptureStats
	done := make(chan error, 1)
	go func() {
		done <- host.Do(func() (err error) {
			st, err = Port(context.Background(), "p", o, out)
			return err
		})
	}()
	testutil.Eventually(t, 30*time.Second, func() error {
		select {
		case err := <-done:
			done <- err
			return nil
		default:
		}
		poke()
		return errors.New("the capture has not ended")
	}, what)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	return st
}
