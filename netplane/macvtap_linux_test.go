package netplane

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// The LAN of TestBridgedMacvtap: its router, and the range its DHCP server
// leases from.
const (
	macvtapLANRouter = "10.78.0.1"
	macvtapLANFirst  = "10.78.0.100"
	macvtapLANLast   = "10.78.0.150"
)

// TestBridgedMacvtap is a VM on a bridged network whose interface is not a
// bridge: it gets a macvtap, and speaks DHCP to the LAN through /dev/tapN as
// a VM would, raw Ethernet frames in and out. The LAN is a namespace at the
// other end of the veth uplink0, with busybox's udhcpd.
func TestBridgedMacvtap(t *testing.T) {
	testutil.RequireCommands(t, "busybox", "nft")
	host, lan := testutil.NewNS(t, "mv-host"), testutil.NewNS(t, "mv-lan")
	veth(t, host, "uplink0", lan, "")
	lan.DHCPServer(t, "eth0", macvtapLANRouter+"/24", macvtapLANFirst, macvtapLANLast)

	n := &api.Network{ID: "mv", Name: "mv", Mode: api.ModeBridged, Interface: "uplink0", MTU: 1500}
	var nw *Network
	host.MustDo(t, func() (err error) { nw, err = Start(context.Background(), n, Options{}); return err })
	t.Cleanup(func() { nw.Close() })
	mac := mustMAC("52:55:55:00:07:01")
	var tap *os.File
	host.MustDo(t, func() error {
		if b, err := PortBridge(n); err != nil || b != "" {
			return fmt.Errorf("PortBridge = %q, %v; want \"\" (a macvtap)", b, err)
		}
		mv, err := CreateMacvtap(n, "mvt-vm1", mac)
		if err != nil {
			return err
		}
		tap, err = openTap(mv.Attrs().Index)
		return err
	})
	t.Cleanup(func() { tap.Close() })

	xid := dhcpv4.TransactionID{1, 2, 3, 4}
	discover, err := dhcpv4.NewDiscovery(mac, dhcpv4.WithTransactionID(xid), dhcpv4.WithBroadcast(true))
	if err != nil {
		t.Fatal(err)
	}
	frame := udpFrame(mac, discover.ToBytes())
	var offer *dhcpv4.DHCPv4
	testutil.Eventually(t, 20*time.Second, func() error {
		if _, err := tap.Write(frame); err != nil {
			return err
		}
		tap.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		buf := make([]byte, 2048)
		for {
			k, err := tap.Read(buf)
			if err != nil {
				return err
			}
			if m := dhcpReply(buf[:k]); m != nil && m.TransactionID == xid && m.MessageType() == dhcpv4.MessageTypeOffer {
				offer = m
				return nil
			}
		}
	}, "an OFFER from the LAN through the macvtap")
	if err := testutil.InRange(offer.YourIPAddr.String(), macvtapLANFirst, macvtapLANLast); err != nil {
		t.Errorf("offered %v", err)
	}
	if r := offer.Router(); len(r) != 1 || r[0].String() != macvtapLANRouter {
		t.Errorf("offered router %v, want %s", r, macvtapLANRouter)
	}

	host.MustDo(t, func() error {
		var s *State
		s, err := Inspect(context.Background(), "mv")
		if err != nil {
			return err
		}
		if len(s.Macvtaps) != 1 || s.Macvtaps[0] != "mvt-vm1" {
			return fmt.Errorf("Inspect: %+v", s)
		}
		if err := Remove(context.Background(), "mv", ""); err != nil {
			return err
		}
		if _, err := netlink.LinkByName("mvt-vm1"); !hostnet.NotFound(err) {
			return fmt.Errorf("macvtap survived Remove: %v", err)
		}
		return nil
	})
}

// openTap opens a macvtap's character device, without the virtio-net header
// macvtap adds by default, so reads and writes are plain Ethernet frames.
func openTap(ifindex int) (*os.File, error) {
	path := fmt.Sprintf("/dev/tap%d", ifindex)
	var fd int
	// devtmpfs creates the node asynchronously: wait for it to appear.
	err := testutil.Poll(time.Second, func() (err error) {
		fd, err = unix.Open(path, unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil && !errors.Is(err, unix.ENOENT) {
			return testutil.Permanent(err)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	ifr, err := unix.NewIfreq("")
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("TUNSETIFF on %s: %w", path, err)
	}
	return os.NewFile(uintptr(fd), path), nil
}

// udpFrame wraps a DHCP client message in UDP 68→67, IPv4 0.0.0.0 →
// 255.255.255.255 and an Ethernet broadcast frame from src.
func udpFrame(src net.HardwareAddr, payload []byte) []byte {
	f := make([]byte, 14+20+8+len(payload))
	copy(f[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(f[6:12], src)
	binary.BigEndian.PutUint16(f[12:14], 0x0800)
	ip := f[14:34]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:4], uint16(20+8+len(payload)))
	ip[8] = 64
	ip[9] = unix.IPPROTO_UDP
	copy(ip[16:20], []byte{255, 255, 255, 255})
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i : i+2]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(ip[10:12], ^uint16(sum))
	udp := f[34:42]
	binary.BigEndian.PutUint16(udp[0:2], 68)
	binary.BigEndian.PutUint16(udp[2:4], 67)
	binary.BigEndian.PutUint16(udp[4:6], uint16(8+len(payload))) // checksum 0: none
	copy(f[42:], payload)
	return f
}

// dhcpReply parses an Ethernet frame carrying UDP to port 68, or returns nil.
func dhcpReply(f []byte) *dhcpv4.DHCPv4 {
	if len(f) < 14+20+8 || binary.BigEndian.Uint16(f[12:14]) != 0x0800 || f[14+9] != unix.IPPROTO_UDP {
		return nil
	}
	ihl := int(f[14]&0x0f) * 4
	udp := f[14+ihl:]
	if len(udp) < 8 || binary.BigEndian.Uint16(udp[2:4]) != 68 {
		return nil
	}
	m, err := dhcpv4.FromBytes(udp[8:])
	if err != nil {
		return nil
	}
	return m
}
