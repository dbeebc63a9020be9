package dhcpserver

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"
	"github.com/vmnetctl/vmnetctl/checksum"
	"github.com/vmnetctl/vmnetctl/rawsock"
	"github.com/vmnetctl/vmnetctl/rtlink"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// The DHCP server reads its requests from a packet socket on the bridge,
// which gives each one with the Ethernet address it was sent from: a UDP
// socket gives only the IP source, which a client without an address does
// not have. The client address in the message (chaddr) must be that
// sender's (Server.handle). Replies go out through the packet socket
// too, to that Ethernet address alone (Socket.reply): a broadcast
// reply would reach every VM on the network, an isolated one's too, with
// options the client chose. A UDP socket on the bridge's port 67
// (server4's) keeps the port bound; a filter makes it discard what it
// receives.

// dhcpFilter passes unfragmented IPv4 UDP datagrams to port 67: what a
// packet socket of type SOCK_DGRAM sees starts at the IP header.
var dhcpFilter = []bpf.Instruction{
	bpf.LoadAbsolute{Off: 9, Size: 1}, // protocol
	bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: unix.IPPROTO_UDP, SkipTrue: 6},
	bpf.LoadAbsolute{Off: 6, Size: 2}, // flags and fragment offset
	bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: 0x3fff, SkipTrue: 4},
	bpf.LoadMemShift{Off: 0},          // X = header length
	bpf.LoadIndirect{Off: 2, Size: 2}, // UDP destination port
	bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: 67, SkipTrue: 1},
	bpf.RetConstant{Val: 0xffff},
	bpf.RetConstant{Val: 0},
}

// downRetry is how long the DHCP server waits to read again while its
// bridge is down.
const downRetry = time.Second

// dropAll makes a socket discard everything it receives.
var dropAll = []bpf.Instruction{bpf.RetConstant{Val: 0}}

// Socket is a network's DHCP server socket pair.
type Socket struct {
	in      *os.File       // the packet socket, in Go's poller
	ifindex int            // the bridge's
	port    net.PacketConn // the UDP socket that holds port 67
}

// Listen opens the DHCP sockets on bridge.
func Listen(bridge string) (*Socket, error) {
	index, err := rtlink.Index(bridge)
	if err != nil {
		return nil, err
	}
	out, err := server4.NewIPv4UDPConn(bridge, &net.UDPAddr{Port: dhcpv4.ServerPort})
	if err != nil {
		return nil, err
	}
	raw, err := out.SyscallConn()
	if err == nil {
		var ferr error
		err = raw.Control(func(fd uintptr) { ferr = rawsock.AttachFilter(int(fd), dropAll) })
		err = errors.Join(err, ferr)
	}
	if err != nil {
		out.Close()
		return nil, fmt.Errorf("filtering the UDP socket: %w", err)
	}
	// The filter comes before bind, so no other packet is ever queued.
	in, err := rawsock.Listen(index, unix.ETH_P_IP, dhcpFilter, "dhcp")
	if err != nil {
		out.Close()
		return nil, fmt.Errorf("packet socket on %s: %w", bridge, err)
	}
	return &Socket{in: in, ifindex: index, port: out}, nil
}

// read returns the next DHCP message sent to the bridge from outside the
// host and its Ethernet source address. A datagram that is not one is
// skipped.
func (s *Socket) read(buf []byte) ([]byte, net.HardwareAddr, error) {
	raw, err := s.in.SyscallConn()
	if err != nil {
		return nil, nil, err
	}
	for {
		n, from, err := rawsock.RecvFrom(raw, buf)
		if err != nil {
			return nil, nil, err
		}
		ll, ok := from.(*unix.SockaddrLinklayer)
		if !ok || ll.Pkttype == unix.PACKET_OUTGOING || ll.Halen != 6 || n < 20 {
			continue
		}
		ihl := int(buf[0]&0x0f) * 4
		if buf[0]>>4 != 4 || ihl < 20 || n < ihl+8 {
			continue
		}
		udpLen := int(binary.BigEndian.Uint16(buf[ihl+4:]))
		if udpLen < 8 || ihl+udpLen > n {
			continue
		}
		mac := net.HardwareAddr(append([]byte(nil), ll.Addr[:6]...))
		return buf[ihl+8 : ihl+udpLen], mac, nil
	}
}

// reply sends payload from the gateway's port 67 to port 68 of dst, in a
// frame to the Ethernet address to alone.
func (s *Socket) reply(to net.HardwareAddr, gw, dst netip.Addr, payload []byte) error {
	pkt := udp4Packet(gw, dst, dhcpv4.ServerPort, dhcpv4.ClientPort, payload)
	return rawsock.SendTo(s.in, s.ifindex, unix.ETH_P_IP, to, pkt)
}

// udp4Packet is an IPv4 packet (TTL 64, no options) carrying a UDP
// datagram, with both checksums.
func udp4Packet(src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	const ipLen, udpLen = 20, 8
	p := make([]byte, ipLen+udpLen+len(payload))
	ip, udp := p[:ipLen], p[ipLen:]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(len(p)))
	ip[8], ip[9] = 64, unix.IPPROTO_UDP
	s4, d4 := src.As4(), dst.As4()
	copy(ip[12:16], s4[:])
	copy(ip[16:20], d4[:])
	binary.BigEndian.PutUint16(ip[10:], checksum.Of(ip))
	binary.BigEndian.PutUint16(udp[0:], sport)
	binary.BigEndian.PutUint16(udp[2:], dport)
	binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
	copy(udp[udpLen:], payload)
	pseudo := make([]byte, 12)
	copy(pseudo, ip[12:20])
	pseudo[9] = unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(pseudo[10:], uint16(len(udp)))
	c := checksum.Of(pseudo, udp)
	if c == 0 {
		c = 0xffff // 0 would say "no checksum" (RFC 768)
	}
	binary.BigEndian.PutUint16(udp[6:], c)
	return p
}

// Close closes both sockets; a read under way returns an error.
func (s *Socket) Close() error {
	return errors.Join(s.in.Close(), s.port.Close())
}

// Serve answers what s reads with h, one message at a time, until s is
// closed. While the bridge is down, reads fail; they are tried again every
// downRetry until stop is closed.
func Serve(s *Socket, h *Server, stop <-chan struct{}) error {
	buf := make([]byte, 65536)
	for {
		payload, src, err := s.read(buf)
		if errors.Is(err, unix.ENETDOWN) {
			select {
			case <-stop:
				return nil
			case <-time.After(downRetry):
				continue
			}
		}
		if err != nil {
			return err
		}
		req, err := dhcpv4.FromBytes(payload)
		if err != nil {
			h.count("", "", true)
			continue
		}
		h.serve(s, src, req)
	}
}
