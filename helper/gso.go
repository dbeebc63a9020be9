package helper

import (
	"encoding/binary"
	"errors"
)

// Software segmentation for a VM without offloads. The TAP then takes TCP
// segments of up to 64 KiB from the host's stack (TSO on the TAP), which
// costs the host one packet, one TAP read and one pass through its stack
// per 64 KiB instead of per 1.5 KiB; the helper cuts each into frames the
// VM's MTU allows, with their headers and checksums, and sends them in one
// sendmmsg. This is the virtio-net header's contract (struct
// virtio_net_hdr_v1): flags, gso_type, hdr_len, gso_size, csum_start,
// csum_offset.

// virtio-net header fields.
const (
	vnetFlagNeedsCsum = 1
	vnetGSONone       = 0
	vnetGSOTCPv4      = 1
	vnetGSOTCPv6      = 4
	vnetGSOECN        = 0x80
)

var errBadGSO = errors.New("malformed GSO packet")

// csumAdd adds b to a ones' complement sum, 8 bytes at a time (the
// 16-bit words of four 32-bit halves, carries folded at the end).
func csumAdd(sum uint32, b []byte) uint32 {
	acc := uint64(sum)
	for len(b) >= 8 {
		v := binary.BigEndian.Uint64(b)
		acc += v>>48 + v>>32&0xffff + v>>16&0xffff + v&0xffff
		b = b[8:]
	}
	for len(b) >= 2 {
		acc += uint64(b[0])<<8 | uint64(b[1])
		b = b[2:]
	}
	if len(b) == 1 {
		acc += uint64(b[0]) << 8
	}
	for acc > 0xffffffff {
		acc = acc>>32 + acc&0xffffffff
	}
	return uint32(acc)
}

func csumFold(sum uint32) uint16 {
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

// completeChecksum finishes a partial checksum (VIRTIO_NET_HDR_F_NEEDS_CSUM):
// the field at csumStart+csumOffset holds the pseudo-header's sum; the sum
// of everything from csumStart on goes there.
func completeChecksum(frame []byte, csumStart, csumOffset int) error {
	at := csumStart + csumOffset
	if csumStart < 0 || at+2 > len(frame) {
		return errBadGSO
	}
	binary.BigEndian.PutUint16(frame[at:], csumFold(csumAdd(0, frame[csumStart:])))
	return nil
}

// segmentTCP cuts the TCP segment pkt (an Ethernet frame whose IP header
// starts at 14 and TCP header at csumStart), which carries more payload
// than mss, into frames of at most mss bytes of payload, each written into
// the buffer of n bytes that out returns (the next slot of a batch). Every frame gets its own IP length (and IPv4 id and header
// checksum), TCP sequence number, flags (FIN and PSH on the last only, CWR
// on the first only) and a complete TCP checksum.
func segmentTCP(pkt []byte, ipv6 bool, csumStart, mss int, out func(n int) ([]byte, error)) error {
	const ethLen = 14
	if csumStart < ethLen+20 || len(pkt) < csumStart+20 || mss <= 0 {
		return errBadGSO
	}
	tcpLen := int(pkt[csumStart+12]>>4) * 4
	hdrLen := csumStart + tcpLen
	if tcpLen < 20 || hdrLen > len(pkt) {
		return errBadGSO
	}
	ip := pkt[ethLen:csumStart]
	payload := pkt[hdrLen:]
	seq := binary.BigEndian.Uint32(pkt[csumStart+4:])
	flags := pkt[csumStart+13]
	var id uint16
	if !ipv6 {
		if len(ip) < 20 || ip[0]>>4 != 4 {
			return errBadGSO
		}
		id = binary.BigEndian.Uint16(ip[4:])
	} else if len(ip) < 40 || ip[0]>>4 != 6 {
		return errBadGSO
	}
	for off, i := 0, 0; off < len(payload); off, i = off+mss, i+1 {
		end := min(off+mss, len(payload))
		f, err := out(hdrLen + end - off)
		if err != nil {
			return err
		}
		copy(f, pkt[:hdrLen])
		copy(f[hdrLen:], payload[off:end])
		fip, tcp := f[ethLen:csumStart], f[csumStart:]
		segLen := tcpLen + end - off
		if ipv6 {
			binary.BigEndian.PutUint16(fip[4:], uint16(len(fip)-40+segLen))
		} else {
			binary.BigEndian.PutUint16(fip[2:], uint16(len(fip)+segLen))
			binary.BigEndian.PutUint16(fip[4:], id+uint16(i))
			fip[10], fip[11] = 0, 0
			binary.BigEndian.PutUint16(fip[10:], csumFold(csumAdd(0, fip[:int(fip[0]&0x0f)*4])))
		}
		binary.BigEndian.PutUint32(tcp[4:], seq+uint32(off))
		fl := flags
		if end < len(payload) {
			fl &^= 0x01 | 0x08 // FIN, PSH: the last segment's
		}
		if i > 0 {
			fl &^= 0x80 // CWR: the first's
		}
		tcp[13] = fl
		// The TCP checksum: pseudo-header, then the segment.
		tcp[16], tcp[17] = 0, 0
		var sum uint32
		if ipv6 {
			sum = csumAdd(sum, fip[8:40])
			sum += uint32(segLen) + 6
		} else {
			sum = csumAdd(sum, fip[12:20])
			sum += uint32(segLen) + 6
		}
		binary.BigEndian.PutUint16(tcp[16:], csumFold(csumAdd(sum, tcp)))
	}
	return nil
}

// vnetHdr is the part of a virtio-net header segmentation reads.
type vnetHdr struct {
	flags, gsoType               uint8
	gsoSize, csumStart, csumOffs uint16
}

func parseVnetHdr(b []byte) vnetHdr {
	return vnetHdr{flags: b[0], gsoType: b[1], gsoSize: binary.LittleEndian.Uint16(b[4:]),
		csumStart: binary.LittleEndian.Uint16(b[6:]), csumOffs: binary.LittleEndian.Uint16(b[8:])}
}

// toFrames turns what the TAP gave (a virtio-net header, then a packet that
// may be a TCP segment of up to 64 KiB, or need its checksum) into frames
// a VM without offloads takes, each written into a buffer out returns.
func toFrames(hdr, pkt []byte, out func(n int) ([]byte, error)) error {
	h := parseVnetHdr(hdr)
	switch h.gsoType &^ vnetGSOECN {
	case vnetGSONone:
		if h.flags&vnetFlagNeedsCsum != 0 {
			if err := completeChecksum(pkt, int(h.csumStart), int(h.csumOffs)); err != nil {
				return err
			}
		}
		f, err := out(len(pkt))
		if err != nil {
			return err
		}
		copy(f, pkt)
		return nil
	case vnetGSOTCPv4, vnetGSOTCPv6:
		return segmentTCP(pkt, h.gsoType&^vnetGSOECN == vnetGSOTCPv6, int(h.csumStart), int(h.gsoSize), out)
	}
	return errBadGSO
}
