package relay

import (
	"encoding/binary"

	"github.com/vmnetctl/vmnetctl/checksum"
	"github.com/vmnetctl/vmnetctl/helperproto"
)

// Coalescing a VM's TCP segments on their way to the host (GRO in the
// relay). A VM whose VMM speaks no virtio-net header (qemu's -netdev dgram,
// and every VMM without --enable-tso) sends frames of at most the MTU, and
// each frame written to a plain TAP is one trip through the host's bridge,
// guard and TCP receive, in the helper's thread. Its port has the header
// instead, with no offloads asked of the host (so what the host sends the
// VM is still cut to the MTU by the kernel, and read one frame per read):
// the relay writes a run of consecutive segments of one TCP flow from a
// batch as one packet of up to 64 KiB that the header describes as
// TCP segmentation offload, which the host's stack takes as it takes one
// from a VM with offloads (and cuts again where it forwards it to a port
// without them). Every other frame goes to the TAP as it came, behind a
// header that asks for nothing.
//
// Only what Linux's own GRO would merge is merged, and each segment's
// checksums are checked first (the merged packet's TCP checksum is left to
// the kernel, which trusts it for local delivery): a segment that fails a
// check is written alone, and the kernel judges it as before.

// The virtio-net header (struct virtio_net_hdr_v1, helperproto.VirtioNetHdrLen bytes),
// little-endian.
const (
	vnetNeedsCsum = 1 // VIRTIO_NET_HDR_F_NEEDS_CSUM
	gsoTCPv4      = 1 // VIRTIO_NET_HDR_GSO_TCPV4
	gsoTCPv6      = 4 // VIRTIO_NET_HDR_GSO_TCPV6

	etherIPv4 = 0x0800
	etherIPv6 = 0x86dd

	protoTCP = 6

	tcpACK = 0x10
	tcpPSH = 0x08

	// maxCoalesced bounds a merged frame: the Ethernet header and an IP
	// packet whose length field still holds it.
	maxCoalesced = EthHeaderLen + 0xffff
)

// vnetHdr is a virtio-net header's fields (struct virtio_net_hdr_v1 but
// num_buffers, which a TAP leaves 0): parseVnetHdr reads the one before a
// packet from the TAP (gso.go), put writes the one before a merged packet.
type vnetHdr struct {
	flags, gsoType       uint8
	hdrLen, gsoSize      int
	csumStart, csumOffst int
}

func parseVnetHdr(b []byte) vnetHdr {
	return vnetHdr{
		flags:     b[0],
		gsoType:   b[1],
		hdrLen:    int(binary.LittleEndian.Uint16(b[2:])),
		gsoSize:   int(binary.LittleEndian.Uint16(b[4:])),
		csumStart: int(binary.LittleEndian.Uint16(b[6:])),
		csumOffst: int(binary.LittleEndian.Uint16(b[8:])),
	}
}

// put writes h into b's first helperproto.VirtioNetHdrLen bytes.
func (h vnetHdr) put(b []byte) {
	b = b[:helperproto.VirtioNetHdrLen]
	clear(b)
	b[0], b[1] = h.flags, h.gsoType
	binary.LittleEndian.PutUint16(b[2:], uint16(h.hdrLen))
	binary.LittleEndian.PutUint16(b[4:], uint16(h.gsoSize))
	binary.LittleEndian.PutUint16(b[6:], uint16(h.csumStart))
	binary.LittleEndian.PutUint16(b[8:], uint16(h.csumOffst))
}

// segment is what coalescing needs of a frame that is a TCP segment it may
// merge; ok is false for every other frame.
type segment struct {
	ok      bool
	ipv6    bool
	l4      int    // offset of the TCP header
	payload int    // offset of the payload
	seq     uint32 // the segment's sequence number
	push    bool
}

// parseSegment reads frame f: an untagged IPv4 packet without options or
// fragmentation, or an IPv6 packet without extension headers, carrying a
// TCP segment with data and only ACK (and PSH) set, whose lengths agree
// with the frame's. Checksums are not checked here (checksumsOK).
func parseSegment(f []byte) segment {
	var s segment
	if len(f) < EthHeaderLen+40 {
		return s
	}
	ip := f[EthHeaderLen:]
	switch binary.BigEndian.Uint16(f[12:]) {
	case etherIPv4:
		// Version 4, IHL 5; total length is the frame's; no MF, no
		// offset (DF may be set); TCP.
		if ip[0] != 0x45 || int(binary.BigEndian.Uint16(ip[2:])) != len(ip) ||
			binary.BigEndian.Uint16(ip[6:])&0x3fff != 0 || ip[9] != protoTCP {
			return s
		}
		s.l4 = EthHeaderLen + 20
	case etherIPv6:
		if ip[0]>>4 != 6 || int(binary.BigEndian.Uint16(ip[4:]))+40 != len(ip) || ip[6] != protoTCP {
			return s
		}
		s.ipv6, s.l4 = true, EthHeaderLen+40
	default:
		return s
	}
	tcp := f[s.l4:]
	if len(tcp) < 20 {
		return s
	}
	thl := int(tcp[12]>>4) * 4
	if thl < 20 || tcp[12]&0x0f != 0 || thl >= len(tcp) {
		return s // a bad offset, reserved bits, or no data
	}
	switch flags := tcp[13]; flags {
	case tcpACK, tcpACK | tcpPSH:
		s.push = flags&tcpPSH != 0
	default:
		return s
	}
	if binary.BigEndian.Uint16(tcp[18:]) != 0 {
		return s // an urgent pointer
	}
	s.payload = s.l4 + thl
	s.seq = binary.BigEndian.Uint32(tcp[4:])
	s.ok = true
	return s
}

// follows says whether segment n (frame nf) continues the run that begins
// with segment first (frame ff) and has carried size payload bytes so far,
// each of mss bytes: the same headers but for the lengths, IPv4's ID and
// checksums, and TCP's sequence number and checksum; the next sequence
// number and IPv4 ID; and a run that ends with its one short or pushed
// segment.
func follows(ff []byte, first segment, size, mss int, nf []byte, n segment) bool {
	if !n.ok || n.ipv6 != first.ipv6 || n.payload != first.payload || size%mss != 0 ||
		n.seq != first.seq+uint32(size) || len(nf)-n.payload > mss ||
		first.payload+size+len(nf)-n.payload > maxCoalesced {
		return false
	}
	// Ethernet header, then IP.
	if string(ff[:EthHeaderLen]) != string(nf[:EthHeaderLen]) {
		return false
	}
	a, b := ff[EthHeaderLen:first.l4], nf[EthHeaderLen:n.l4]
	if first.ipv6 {
		// Version, class and flow label; next header and hop limit;
		// the addresses.
		if string(a[:4]) != string(b[:4]) || string(a[6:]) != string(b[6:]) {
			return false
		}
	} else {
		// Version, IHL and TOS; flags, offset, TTL and protocol; the
		// addresses; and an ID one up for each segment, as the kernel
		// numbers the segments when it cuts the packet again (a flow that
		// keeps its ID fixed is not merged).
		if string(a[:2]) != string(b[:2]) || string(a[6:10]) != string(b[6:10]) || string(a[12:]) != string(b[12:]) ||
			binary.BigEndian.Uint16(b[4:]) != binary.BigEndian.Uint16(a[4:])+uint16(size/mss) {
			return false
		}
	}
	// TCP: ports; acknowledgement, offset, flags (as far as the ACK),
	// window; urgent pointer and options.
	x, y := ff[first.l4:first.payload], nf[n.l4:n.payload]
	return string(x[:4]) == string(y[:4]) && string(x[8:13]) == string(y[8:13]) &&
		x[13]&^tcpPSH == y[13]&^tcpPSH && string(x[14:16]) == string(y[14:16]) && string(x[18:]) == string(y[18:])
}

// checksumsOK checks segment s's IPv4 header checksum and its TCP
// checksum.
func checksumsOK(f []byte, s segment) bool {
	var pseudo uint64
	if s.ipv6 {
		pseudo = checksum.Add(0, f[EthHeaderLen+8:s.l4])
	} else {
		if checksum.Fold(checksum.Add(0, f[EthHeaderLen:s.l4])) != 0xffff {
			return false
		}
		pseudo = checksum.Add(0, f[EthHeaderLen+12:s.l4])
	}
	pseudo += uint64(len(f)-s.l4) + protoTCP
	return checksum.Fold(checksum.Add(pseudo, f[s.l4:])) == 0xffff
}

// merge writes the run of segments frames (their headers segs) into out
// behind a virtio-net header that describes it as TCP segmentation offload
// of mss-byte segments, and returns the packet's length.
func merge(out []byte, frames [][]byte, segs []segment, mss int) int {
	s0 := segs[0]
	n := helperproto.VirtioNetHdrLen + copy(out[helperproto.VirtioNetHdrLen:], frames[0])
	last := segs[0].push
	for i := 1; i < len(frames); i++ {
		n += copy(out[n:], frames[i][segs[i].payload:])
		last = segs[i].push
	}
	pkt := out[helperproto.VirtioNetHdrLen:n]
	ip := pkt[EthHeaderLen:]
	tcp := pkt[s0.l4:]
	var pseudo uint64
	gso := byte(gsoTCPv4)
	if s0.ipv6 {
		binary.BigEndian.PutUint16(ip[4:], uint16(len(ip)-40))
		pseudo = checksum.Add(0, ip[8:40])
		gso = gsoTCPv6
	} else {
		binary.BigEndian.PutUint16(ip[2:], uint16(len(ip)))
		ip[10], ip[11] = 0, 0
		binary.BigEndian.PutUint16(ip[10:], ^checksum.Fold(checksum.Add(0, ip[:20])))
		pseudo = checksum.Add(0, ip[12:20])
	}
	if last {
		tcp[13] |= tcpPSH
	}
	// The TCP checksum is the kernel's to finish: the field holds the
	// pseudo-header's sum (csum_start and csum_offset say where).
	binary.BigEndian.PutUint16(tcp[16:], checksum.Fold(pseudo+uint64(len(tcp))+protoTCP))
	vnetHdr{flags: vnetNeedsCsum, gsoType: gso, hdrLen: s0.payload, gsoSize: mss, csumStart: s0.l4, csumOffst: 16}.put(out)
	return n
}

// Coalescer writes a batch of the VM's frames to a TAP with the
// virtio-net header, merging runs of segments; its buffers are reused.
// The relay uses it, and so does a vhost-user helper (package vhostuser)
// for a guest without offloads.
type Coalescer struct {
	out  []byte
	segs []segment
	run  [][]byte
}

// NewCoalescer returns a Coalescer.
func NewCoalescer() *Coalescer { return &Coalescer{} }

// Write writes hf, each a frame behind helperproto.VirtioNetHdrLen zero bytes, with
// write, in order: runs merged, other frames as they are. It returns what
// it wrote and what the TAP refused, counted in the VM's frames.
func (c *Coalescer) Write(hf [][]byte, write func([]byte) bool) (packets, bytes, drops uint64) {
	c.segs = c.segs[:0]
	for _, f := range hf {
		c.segs = append(c.segs, parseSegment(f[helperproto.VirtioNetHdrLen:]))
	}
	segs := c.segs
	for i := 0; i < len(hf); {
		f0, s0 := hf[i][helperproto.VirtioNetHdrLen:], segs[i]
		j, size, mss := i+1, 0, 0
		if s0.ok && !s0.push {
			mss = len(f0) - s0.payload
			size = mss
			checked := false // f0's checksums, once a segment follows
			for j < len(hf) {
				f := hf[j][helperproto.VirtioNetHdrLen:]
				if !follows(f0, s0, size, mss, f, segs[j]) {
					break
				}
				if !checked {
					if !checksumsOK(f0, s0) {
						break
					}
					checked = true
				}
				if !checksumsOK(f, segs[j]) {
					break
				}
				size += len(f) - segs[j].payload
				j++
				if segs[j-1].push {
					break
				}
			}
		}
		if j > i+1 {
			if c.out == nil {
				// Only once a run comes: an idle helper has no use for it.
				c.out = make([]byte, helperproto.VirtioNetHdrLen+maxCoalesced)
			}
			c.run = c.run[:0]
			var n uint64
			for k := i; k < j; k++ {
				c.run = append(c.run, hf[k][helperproto.VirtioNetHdrLen:])
				n += uint64(len(hf[k]) - helperproto.VirtioNetHdrLen)
			}
			if write(c.out[:merge(c.out, c.run, segs[i:j], mss)]) {
				packets += uint64(j - i)
				bytes += n
				i = j
				continue
			}
			// The TAP refused the merged packet (no memory for 64 KiB, or
			// a kernel that will not take it): the frames go one by one,
			// as they would have without merging.
		}
		for ; i < j; i++ {
			if write(hf[i]) {
				packets++
				bytes += uint64(len(hf[i]) - helperproto.VirtioNetHdrLen)
			} else {
				drops++
			}
		}
	}
	return packets, bytes, drops
}
