package relay

import (
	"fmt"
	"io"
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestRelayOffloadsThroughKernel: a VM's TCP streams, IPv4 and IPv6,
// through a relay whose TAP has the offloads the VM has not, to and from a
// host's real stack: every byte arrives in order both ways; the TAP took
// fewer packets than the VM sent frames (the relay merged them, and the
// kernel took the merged packets), and handed fewer than the VM got (the
// relay cut the host's 64 KiB packets).
func TestRelayOffloadsThroughKernel(t *testing.T) {
	testutil.RequireRoot(t, "creates network namespaces and TAPs")
	host, vm := testutil.NewNS(t, "co-host"), testutil.NewNS(t, "co-vm")

	// The host: the relay's TAP, with the header and offloads, as a port
	// with netplane's Offloads{Relayed: true} has. The VM: a plain
	// TAP whose frames a goroutine moves to and from the relay's socket,
	// as a VMM without offloads does.
	var tap, nic int
	for _, o := range []struct {
		ns   *testutil.NS
		name string
		hdr  bool
		fd   *int
	}{{host, "htap", true, &tap}, {vm, "vmeth", false, &nic}} {
		if err := o.ns.Do(func() (err error) {
			*o.fd, err = openTAP(o.name, o.hdr)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { unix.Close(tap) })
	for _, c := range []struct {
		ns   *testutil.NS
		link string
		addr []string
	}{
		{host, "htap", []string{"10.9.0.1/24", "fd09::1/64"}},
		{vm, "vmeth", []string{"10.9.0.2/24", "fd09::2/64"}},
	} {
		for _, a := range c.addr {
			c.ns.MustRun(t, "ip", "addr", "add", a, "dev", c.link, "nodad")
		}
		c.ns.MustRun(t, "ip", "link", "set", c.link, "up")
	}

	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 1<<20)
	}
	unix.SetNonblock(fds[0], true)
	stop, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{tap: tap, sock: fds[0], stop: stop, tapHdr: helperproto.VirtioNetHdrLen, frame: 1514,
		host: &counters{}, vm: &counters{}, log: &Logger{w: io.Discard}}
	done := make(chan error, 1)
	go func() { done <- r.run(nil) }()
	// The VMM's two directions, on files the runtime's poller can
	// interrupt when the test ends.
	unix.SetNonblock(fds[1], true)
	nicFile, vmEnd := os.NewFile(uintptr(nic), "vmeth"), os.NewFile(uintptr(fds[1]), "vm-end")
	move := func(from, to *os.File) {
		buf := make([]byte, 2048)
		for {
			n, err := from.Read(buf)
			if err != nil {
				return
			}
			to.Write(buf[:n])
		}
	}
	go move(nicFile, vmEnd)
	go move(vmEnd, nicFile)
	t.Cleanup(func() {
		signal(stop)
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
		nicFile.Close()
		vmEnd.Close()
		unix.Close(fds[0])
		unix.Close(stop)
	})

	for _, addr := range []string{"10.9.0.1", "fd09::1"} {
		for _, toVM := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s toVM=%v", addr, toVM), func(t *testing.T) {
				before := host.LinkStats(t, "htap")
				sentBefore, gotBefore := r.vm.packets.Load(), r.host.packets.Load()
				const size = 8 << 20
				testutil.StreamChecked(t, host, vm, net.JoinHostPort(addr, "0"), size, toVM)
				after := host.LinkStats(t, "htap")
				if toVM {
					handed, got := after.TxPackets-before.TxPackets, r.host.packets.Load()-gotBefore
					t.Logf("the TAP handed %d packets, the VM got %d frames", handed, got)
					if got < size/1500 || handed*2 > got {
						t.Errorf("the TAP handed %d packets and the VM got %d frames: not cut by the relay", handed, got)
					}
					return
				}
				taken, sent := after.RxPackets-before.RxPackets, r.vm.packets.Load()-sentBefore
				t.Logf("the VM sent %d frames, the TAP took %d packets", sent, taken)
				if sent < size/1500 || taken*2 > sent {
					t.Errorf("the VM sent %d frames and the TAP took %d packets: not merged", sent, taken)
				}
			})
		}
	}
	if d := r.vm.drops.Load() + r.host.drops.Load(); d != 0 {
		t.Errorf("the relay dropped %d frames", d)
	}
}

// openTAP opens TAP name in the current namespace, non-blocking, with the
// virtio-net header, checksum offload and TSO if hdr.
func openTAP(name string, hdr bool) (int, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return -1, err
	}
	ifr, err := unix.NewIfreq(name)
	flags := uint16(unix.IFF_TAP | unix.IFF_NO_PI)
	if hdr {
		flags |= unix.IFF_VNET_HDR
	}
	if err == nil {
		ifr.SetUint16(flags)
		err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
	}
	if err == nil && hdr {
		if err = unix.IoctlSetPointerInt(fd, unix.TUNSETVNETHDRSZ, helperproto.VirtioNetHdrLen); err == nil {
			err = unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, unix.TUN_F_CSUM|unix.TUN_F_TSO4|unix.TUN_F_TSO6)
		}
	}
	if err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("TAP %s: %w", name, err)
	}
	return fd, nil
}
