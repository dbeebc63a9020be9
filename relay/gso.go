package relay

import (
	"encoding/binary"
	"errors"

	"github.com/vmnetctl/vmnetctl/checksum"
	"github.com/vmnetctl/vmnetctl/helperproto"
)

// Host-side offloads for a VM without them. A VM whose VMM speaks no
// virtio-net header takes and sends frames of at most the network's MTU.
// Its TAP still has the header and TCP segmentation offload: the host's
// stack then hands the TAP one packet of up to 64 KiB where it would have
// handed it 45 frames, and the helper cuts it into the VM's frames itself
// (Segmenter), with the checksums the VM expects. One read from the TAP
// instead of one per frame, and one trip through the host's stack: what
// makes the host→VM direction cheaper. The VM's frames go to the TAP as they
// came, behind a header that asks for nothing (its checksums are checked
// by the host's stack as before).

const (
	gsoNone   = 0
	gsoECN    = 0x80
	etherVLAN = 0x8100
	etherQinQ = 0x88a8
	// minMSS is Linux's net.ipv4.tcp_min_snd_mss default.
	minMSS = 48
	tcpFIN = 0x01
	tcpCWR = 0x80
)

// TapMaxPacket is the most a TAP with TSO hands over at once: a 64 KiB IP
// packet and its Ethernet header (with a VLAN tag), behind no header.
const TapMaxPacket = 65535 + EthHeaderLen + 4

var errBadGSO = errors.New("a packet from the TAP its header does not describe")

// Segmenter cuts one packet read from the TAP, behind its virtio-net
// header, into the VM's frames: a TCP segmentation offload packet into
// segments of gso_size, anything else into itself; checksums the header
// left to the device are computed. The datagram relay and the vhost-user
// backend (for a guest without TSO) both use it.
type Segmenter struct {
	pkt        []byte
	h          vnetHdr
	ipOff      int
	ipv6       bool
	tcpOff     int
	hdrLen     int // Ethernet, IP and TCP headers
	mss        int
	count, i   int
	ipID, seq  uint32
	tcpFlags   byte
	check      uint16 // the packet's TCP checksum field: its pseudo-header's sum
	frameLimit int
}

// reset takes the packet b (header and frame) for frames of at most limit
// bytes; it fails for a packet it cannot cut, which is then dropped, and
// leaves nothing to cut (More is false).
func (s *Segmenter) Reset(b []byte, limit int) (err error) {
	defer func() {
		if err != nil {
			s.count = 0
		}
	}()
	*s = Segmenter{h: parseVnetHdr(b), pkt: b[helperproto.VirtioNetHdrLen:], frameLimit: limit}
	pkt := s.pkt
	if len(pkt) < EthHeaderLen {
		return errBadGSO
	}
	gso := s.h.gsoType &^ gsoECN
	if gso == gsoNone {
		s.count = 1
		if len(pkt) > limit {
			return errBadGSO
		}
		if s.h.flags&vnetNeedsCsum != 0 && s.h.csumStart+s.h.csumOffst+2 > len(pkt) {
			return errBadGSO
		}
		return nil
	}
	if gso != gsoTCPv4 && gso != gsoTCPv6 {
		return errBadGSO
	}
	s.ipOff = EthHeaderLen
	etherType := binary.BigEndian.Uint16(pkt[12:])
	// Up to two VLAN tags, 802.1Q or 802.1ad, as the kernel hands them.
	for range 2 {
		if etherType != etherVLAN && etherType != etherQinQ {
			break
		}
		if len(pkt) < s.ipOff+4 {
			return errBadGSO
		}
		s.ipOff += 4
		etherType = binary.BigEndian.Uint16(pkt[s.ipOff-2:])
	}
	s.ipv6 = gso == gsoTCPv6
	minIP := 20
	if s.ipv6 {
		minIP = 40
	}
	if want := uint16(etherIPv4); s.ipv6 && etherType != etherIPv6 || !s.ipv6 && etherType != want {
		return errBadGSO
	}
	s.tcpOff = s.h.csumStart
	if s.tcpOff < s.ipOff+minIP || s.tcpOff+20 > len(pkt) {
		return errBadGSO
	}
	if s.ipv6 {
		if s.tcpOff == s.ipOff+40 && pkt[s.ipOff+6] != protoTCP {
			return errBadGSO
		}
	} else if ihl := int(pkt[s.ipOff]&0xf) * 4; ihl < 20 || s.ipOff+ihl != s.tcpOff || pkt[s.ipOff+9] != protoTCP {
		return errBadGSO
	}
	s.hdrLen = s.tcpOff + int(pkt[s.tcpOff+12]>>4)*4
	s.mss = s.h.gsoSize
	// An MSS below Linux's least (tcp_min_snd_mss) only multiplies frames:
	// a 64 KiB packet of 1-byte segments would be 65 000 of them.
	if s.hdrLen < s.tcpOff+20 || s.hdrLen > len(pkt) || s.mss < minMSS || s.hdrLen+s.mss > limit {
		return errBadGSO
	}
	s.count = (len(pkt) - s.hdrLen + s.mss - 1) / s.mss
	if s.count == 0 {
		s.count = 1
	}
	if !s.ipv6 {
		s.ipID = uint32(binary.BigEndian.Uint16(pkt[s.ipOff+4:]))
	}
	s.seq = binary.BigEndian.Uint32(pkt[s.tcpOff+4:])
	s.tcpFlags = pkt[s.tcpOff+13]
	s.check = binary.BigEndian.Uint16(pkt[s.tcpOff+16:])
	return nil
}

// more says whether frames are left.
func (s *Segmenter) More() bool { return s.i < s.count }

// next writes the next frame into dst, which holds frameLimit bytes, and
// returns its length.
func (s *Segmenter) Next(dst []byte) int {
	i := s.i
	s.i++
	if s.mss == 0 { // not segmentation: the frame itself
		n := copy(dst, s.pkt)
		if s.h.flags&vnetNeedsCsum != 0 {
			at := s.h.csumStart + s.h.csumOffst
			// As the kernel's skb_checksum_help: a sum of 0 is written
			// as 0xffff, which UDP reads as "no checksum" otherwise.
			sum := ^checksum.Fold(checksum.Add(0, dst[s.h.csumStart:n]))
			if sum == 0 {
				sum = 0xffff
			}
			binary.BigEndian.PutUint16(dst[at:], sum)
		}
		return n
	}
	start := s.hdrLen + i*s.mss
	end := min(start+s.mss, len(s.pkt))
	copy(dst, s.pkt[:s.hdrLen])
	n := s.hdrLen + copy(dst[s.hdrLen:], s.pkt[start:end])
	f := dst[:n]
	ip := f[s.ipOff:]
	tcpLen := n - s.tcpOff
	if s.ipv6 {
		binary.BigEndian.PutUint16(ip[4:], uint16(n-s.ipOff-40))
	} else {
		binary.BigEndian.PutUint16(ip[2:], uint16(n-s.ipOff))
		binary.BigEndian.PutUint16(ip[4:], uint16(s.ipID+uint32(i)))
		ip[10], ip[11] = 0, 0
		ihl := int(ip[0]&0xf) * 4
		binary.BigEndian.PutUint16(ip[10:], ^checksum.Fold(checksum.Add(0, ip[:ihl])))
	}
	// The pseudo-header's sum is the one the sender left in the checksum
	// field, for the whole packet's TCP length, changed to this segment's,
	// as the kernel's tcp_gso_segment does (the sender knows the address
	// that counts: an IPv6 routing header's final one).
	sum := uint64(s.check) + uint64(^uint16(len(s.pkt)-s.tcpOff)) + uint64(tcpLen)
	tcp := f[s.tcpOff:]
	binary.BigEndian.PutUint32(tcp[4:], s.seq+uint32(i*s.mss))
	flags := s.tcpFlags
	if s.i < s.count {
		flags &^= tcpFIN | tcpPSH
	}
	if i > 0 {
		flags &^= tcpCWR
	}
	tcp[13] = flags
	tcp[16], tcp[17] = 0, 0
	binary.BigEndian.PutUint16(tcp[16:], ^checksum.Fold(checksum.Add(sum, tcp)))
	return n
}
