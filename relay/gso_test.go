package relay

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/vmnetctl/vmnetctl/helperproto"
)

// checksum16 is RFC 1071's checksum, 16 bits at a time: the test's own,
// independent of the checksum package.
func checksum16(parts ...[]byte) uint16 {
	var sum uint32
	var all []byte
	for _, p := range parts {
		all = append(all, p...)
	}
	for i := 0; i+1 < len(all); i += 2 {
		sum += uint32(all[i])<<8 | uint32(all[i+1])
	}
	if len(all)%2 == 1 {
		sum += uint32(all[len(all)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// gsoPacket is a virtio-net header and an Ethernet frame carrying TCP over
// IPv4 or IPv6 with payload, as a TAP with TSO hands it: the TCP checksum
// field holds the pseudo-header's sum only.
func gsoPacket(ipv6 bool, payload []byte, mss int, flags byte) []byte {
	eth := make([]byte, 14)
	copy(eth, []byte{2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2})
	var ip []byte
	if ipv6 {
		binary.BigEndian.PutUint16(eth[12:], etherIPv6)
		ip = make([]byte, 40)
		ip[0] = 0x60
		ip[6] = 6
		ip[7] = 64
		copy(ip[8:], bytes.Repeat([]byte{0xfd, 1}, 8))
		copy(ip[24:], bytes.Repeat([]byte{0xfd, 2}, 8))
	} else {
		binary.BigEndian.PutUint16(eth[12:], etherIPv4)
		ip = []byte{0x45, 0, 0, 0, 0x12, 0x34, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2}
	}
	tcp := make([]byte, 32) // with 12 bytes of options (timestamps)
	binary.BigEndian.PutUint16(tcp[0:], 5201)
	binary.BigEndian.PutUint16(tcp[2:], 40000)
	binary.BigEndian.PutUint32(tcp[4:], 0xfffff000) // wraps
	binary.BigEndian.PutUint32(tcp[8:], 77)
	tcp[12] = 8 << 4
	tcp[13] = flags
	copy(tcp[20:], []byte{1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2})
	hdr := make([]byte, helperproto.VirtioNetHdrLen)
	hdr[0] = vnetNeedsCsum
	hdr[1] = gsoTCPv4
	if ipv6 {
		hdr[1] = gsoTCPv6
	}
	tcpOff := len(eth) + len(ip)
	// The pseudo-header's sum for the whole TCP length, as a sender leaves
	// it for the device.
	tcpLen := len(tcp) + len(payload)
	var pseudo []byte
	if ipv6 {
		pseudo = append(append([]byte{}, ip[8:40]...), 0, 0, byte(tcpLen>>8), byte(tcpLen), 0, 0, 0, 6)
	} else {
		pseudo = append(append([]byte{}, ip[12:20]...), 0, 6, byte(tcpLen>>8), byte(tcpLen))
	}
	binary.BigEndian.PutUint16(tcp[16:], ^checksum16(pseudo))
	binary.LittleEndian.PutUint16(hdr[2:], uint16(tcpOff+len(tcp)))
	binary.LittleEndian.PutUint16(hdr[4:], uint16(mss))
	binary.LittleEndian.PutUint16(hdr[6:], uint16(tcpOff))
	binary.LittleEndian.PutUint16(hdr[8:], 16)
	return bytes.Join([][]byte{hdr, eth, ip, tcp, payload}, nil)
}

// TestSegmenterTCP: a TSO packet becomes frames of at most the MSS whose IP
// and TCP checksums are right, whose sequence numbers follow, which carry
// the payload in order, and in which FIN and PSH are only on the last
// frame and CWR only on the first.
func TestSegmenterTCP(t *testing.T) {
	for _, ipv6 := range []bool{false, true} {
		for _, size := range []int{1, 1448, 1449, 40000, 65000} {
			payload := make([]byte, size)
			for i := range payload {
				payload[i] = byte(rand.IntN(256))
			}
			mss := 1448
			if ipv6 {
				mss = 1428
			}
			checkSegments(t, ipv6, payload, mss, 0x18|tcpFIN|tcpCWR) // ACK PSH FIN CWR
		}
	}
}

// FuzzSegmenterTCP: whatever the payload, MSS and flags, the frames carry
// the payload in order within the MSS, with checksums that verify,
// sequence numbers that follow, and FIN, PSH and CWR where the kernel puts
// them.
func FuzzSegmenterTCP(f *testing.F) {
	f.Add(false, uint16(3000), uint16(1448), byte(0x19), byte(7))
	f.Add(true, uint16(65000), uint16(48), byte(0x90), byte(1))
	f.Fuzz(func(t *testing.T, ipv6 bool, size, mss uint16, flags, fill byte) {
		max := 1514 - 14 - 20 - 32
		if ipv6 {
			max = 1514 - 14 - 40 - 32
		}
		if size == 0 || int(size) > 65000 || int(mss) < minMSS || int(mss) > max {
			return
		}
		payload := make([]byte, size)
		for i := range payload {
			payload[i] = fill + byte(i)
		}
		checkSegments(t, ipv6, payload, int(mss), flags|0x10)
	})
}

// checkSegments cuts a TSO packet of payload and checks the frames.
func checkSegments(t *testing.T, ipv6 bool, payload []byte, mss int, flags byte) {
	t.Helper()
	pkt := gsoPacket(ipv6, payload, mss, flags)
	var s Segmenter
	if err := s.Reset(pkt, 1514); err != nil {
		t.Fatalf("ipv6 %v, %d bytes: %v", ipv6, len(payload), err)
	}
	var got []byte
	dst := make([]byte, 1514)
	frames := 0
	for s.More() {
		n := s.Next(dst)
		f := dst[:n]
		ipOff, tcpOff := 14, 34
		if ipv6 {
			tcpOff = 54
		}
		ip, tcp := f[ipOff:tcpOff], f[tcpOff:]
		var pseudo []byte
		if ipv6 {
			if l := int(binary.BigEndian.Uint16(ip[4:])); l != len(tcp) {
				t.Errorf("payload length %d, want %d", l, len(tcp))
			}
			pseudo = append(append([]byte{}, ip[8:40]...), 0, 0, byte(len(tcp)>>8), byte(len(tcp)), 0, 0, 0, 6)
		} else {
			if l := int(binary.BigEndian.Uint16(ip[2:])); l != n-ipOff {
				t.Errorf("total length %d, want %d", l, n-ipOff)
			}
			if c := checksum16(ip); c != 0 {
				t.Errorf("frame %d: IPv4 checksum does not verify (%#x)", frames, c)
			}
			if id := binary.BigEndian.Uint16(ip[4:]); id != 0x1234+uint16(frames) {
				t.Errorf("frame %d: IP id %#x", frames, id)
			}
			pseudo = append(append([]byte{}, ip[12:20]...), 0, 6, byte(len(tcp)>>8), byte(len(tcp)))
		}
		if c := checksum16(pseudo, tcp); c != 0 {
			t.Errorf("ipv6 %v frame %d: TCP checksum does not verify (%#x)", ipv6, frames, c)
		}
		if seq := binary.BigEndian.Uint32(tcp[4:]); seq != 0xfffff000+uint32(len(got)) {
			t.Errorf("frame %d: seq %#x, want %#x", frames, seq, 0xfffff000+uint32(len(got)))
		}
		last := !s.More()
		fl := tcp[13]
		want := flags
		if !last {
			want &^= tcpFIN | tcpPSH
		}
		if frames > 0 {
			want &^= tcpCWR
		}
		if fl != want {
			t.Errorf("frame %d (last %v): flags %#x, want %#x", frames, last, fl, want)
		}
		if len(tcp)-32 > mss {
			t.Errorf("frame %d: %d bytes of payload, above the MSS %d", frames, len(tcp)-32, mss)
		}
		got = append(got, tcp[32:]...)
		frames++
	}
	if !bytes.Equal(got, payload) {
		t.Errorf("ipv6 %v, %d bytes: the frames' payload differs from the packet's", ipv6, len(payload))
	}
	if want := (len(payload) + mss - 1) / mss; frames != want {
		t.Errorf("ipv6 %v, %d bytes: %d frames, want %d", ipv6, len(payload), frames, want)
	}
}

// TestSegmenterChecksum: a frame the TAP left its checksum to (UDP here)
// leaves with it computed; one without the flag is copied as it is.
func TestSegmenterChecksum(t *testing.T) {
	udp := []byte{0x30, 0x39, 0x00, 0x35, 0, 13, 0, 0, 'h', 'e', 'l', 'l', 'o'}
	ip := []byte{0x45, 0, 0, 33, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2}
	binary.BigEndian.PutUint16(ip[10:], checksum16(ip))
	pseudo := append(append([]byte{}, ip[12:20]...), 0, 17, 0, 13)
	// The partial checksum: the pseudo-header's sum, not inverted.
	binary.BigEndian.PutUint16(udp[6:], ^checksum16(pseudo))
	eth := []byte{2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 8, 0}
	hdr := make([]byte, helperproto.VirtioNetHdrLen)
	hdr[0] = vnetNeedsCsum
	binary.LittleEndian.PutUint16(hdr[6:], 34)
	binary.LittleEndian.PutUint16(hdr[8:], 6)
	pkt := bytes.Join([][]byte{hdr, eth, ip, udp}, nil)
	var s Segmenter
	if err := s.Reset(pkt, 1514); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, 1514)
	n := s.Next(dst)
	if s.More() || n != 14+20+13 {
		t.Fatalf("%d bytes, more %v: want one frame of 47", n, s.More())
	}
	if c := checksum16(pseudo, dst[34:n]); c != 0 {
		t.Errorf("UDP checksum does not verify (%#x)", c)
	}
	hdr[0] = 0
	plain := bytes.Join([][]byte{hdr, eth, ip, udp}, nil)
	s.Reset(plain, 1514)
	if n := s.Next(dst); !bytes.Equal(dst[:n], plain[helperproto.VirtioNetHdrLen:]) {
		t.Errorf("a frame without NEEDS_CSUM changed")
	}
}

// TestSegmenterRefuses: packets the header does not describe are refused,
// not cut out of bounds.
func TestSegmenterRefuses(t *testing.T) {
	good := gsoPacket(false, make([]byte, 3000), 1448, 0x10)
	for name, mutate := range map[string]func(p []byte){
		"UDP segmentation":          func(p []byte) { p[1] = 5 },
		"csum_start past the end":   func(p []byte) { binary.LittleEndian.PutUint16(p[6:], 9000) },
		"csum_start inside IP":      func(p []byte) { binary.LittleEndian.PutUint16(p[6:], 20) },
		"gso_size 0":                func(p []byte) { binary.LittleEndian.PutUint16(p[4:], 0) },
		"gso_size above the frames": func(p []byte) { binary.LittleEndian.PutUint16(p[4:], 9000) },
		"IPv6 segmentation on IPv4": func(p []byte) { p[1] = gsoTCPv6 },
		"IPv4 header length 60":     func(p []byte) { p[helperproto.VirtioNetHdrLen+14] = 0x4f },
		"gso_size below 48":         func(p []byte) { binary.LittleEndian.PutUint16(p[4:], 47) },
		"IPv4 carrying UDP":         func(p []byte) { p[helperproto.VirtioNetHdrLen+14+9] = 17 },
	} {
		p := bytes.Clone(good)
		mutate(p)
		var s Segmenter
		if err := s.Reset(p, 1514); err == nil {
			t.Errorf("%s: taken", name)
		} else if s.More() {
			t.Errorf("%s: refused, yet frames to cut", name)
		}
	}
	// A frame without segmentation larger than the limit: refused, and
	// nothing left to cut (a caller that looks at More reads the next).
	var big Segmenter
	if err := big.Reset(append(make([]byte, helperproto.VirtioNetHdrLen), make([]byte, 2000)...), 1514); err == nil || big.More() {
		t.Errorf("a 2000-byte frame for 1514: %v, more %v", err, big.More())
	}
	var s Segmenter
	// Four bytes between the IPv4 header and TCP, which the offsets skip.
	at := helperproto.VirtioNetHdrLen + 14 + 20
	gap := append(append(bytes.Clone(good[:at]), 0, 0, 0, 0), good[at:]...)
	for _, o := range []int{2, 6} {
		binary.LittleEndian.PutUint16(gap[o:], binary.LittleEndian.Uint16(gap[o:])+4)
	}
	if err := s.Reset(gap, 1514+4); err == nil {
		t.Errorf("a gap after the IPv4 header: taken")
	}
	if err := s.Reset(tagged(good, etherQinQ, etherVLAN, etherVLAN), 1514+12); err == nil {
		t.Errorf("three VLAN tags: taken")
	}
	if err := s.Reset(good, 1514); err != nil {
		t.Errorf("the good packet: %v", err)
	}
}

func BenchmarkSegment64K(b *testing.B) {
	pkt := gsoPacket(false, make([]byte, 65000), 1448, 0x10)
	dst := make([]byte, 1514)
	var s Segmenter
	b.SetBytes(65000)
	for b.Loop() {
		s.Reset(pkt, 1514)
		for s.More() {
			s.Next(dst)
		}
	}
}

func FuzzSegmenter(f *testing.F) {
	f.Add(gsoPacket(false, make([]byte, 3000), 1448, 0x10))
	f.Add(gsoPacket(true, make([]byte, 3000), 1428, 0x10))
	f.Fuzz(func(t *testing.T, pkt []byte) {
		if len(pkt) < helperproto.VirtioNetHdrLen {
			return
		}
		var s Segmenter
		if s.Reset(pkt, 1514) != nil {
			if s.More() {
				t.Fatal("a packet refused leaves frames to cut")
			}
			return
		}
		dst := make([]byte, 1514)
		for s.More() {
			if n := s.Next(dst); n > len(dst) {
				t.Fatalf("frame of %d bytes", n)
			}
		}
	})
}

// TestSegmenterUDPZeroChecksum: a partial UDP checksum that comes out 0 is
// written as 0xffff, as the kernel writes it (0 means "no checksum" to
// IPv4's UDP and is invalid in IPv6's).
func TestSegmenterUDPZeroChecksum(t *testing.T) {
	ip := []byte{0x45, 0, 0, 30, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2}
	binary.BigEndian.PutUint16(ip[10:], checksum16(ip))
	pseudo := append(append([]byte{}, ip[12:20]...), 0, 17, 0, 10)
	eth := []byte{2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 8, 0}
	hdr := make([]byte, helperproto.VirtioNetHdrLen)
	hdr[0] = vnetNeedsCsum
	binary.LittleEndian.PutUint16(hdr[6:], 34)
	binary.LittleEndian.PutUint16(hdr[8:], 6)
	for v := range 1 << 16 {
		udp := []byte{0x30, 0x39, 0x00, 0x35, 0, 10, 0, 0, byte(v >> 8), byte(v)}
		binary.BigEndian.PutUint16(udp[6:], ^checksum16(pseudo))
		if checksum16(udp) != 0 {
			continue // its checksum does not come out 0
		}
		var s Segmenter
		if err := s.Reset(bytes.Join([][]byte{hdr, eth, ip, udp}, nil), 1514); err != nil {
			t.Fatal(err)
		}
		dst := make([]byte, 1514)
		n := s.Next(dst)
		if got := binary.BigEndian.Uint16(dst[40:]); got != 0xffff {
			t.Fatalf("payload %#04x: UDP checksum %#04x, want 0xffff", v, got)
		}
		if c := checksum16(pseudo, dst[34:n]); c != 0 {
			t.Errorf("UDP checksum does not verify (%#x)", c)
		}
		return
	}
	t.Fatal("no payload whose checksum comes out 0")
}

// tagged is pkt (a virtio-net header and a frame) with VLAN tags of the
// given types after its MACs, its header's offsets moved past them.
func tagged(pkt []byte, types ...uint16) []byte {
	h, f := bytes.Clone(pkt[:helperproto.VirtioNetHdrLen]), pkt[helperproto.VirtioNetHdrLen:]
	out := append(h, f[:12]...)
	for i, typ := range types {
		out = binary.BigEndian.AppendUint16(out, typ)
		out = binary.BigEndian.AppendUint16(out, uint16(10+i)) // the VLAN id
	}
	out = append(out, f[12:]...)
	for _, at := range []int{2, 6} { // hdr_len, csum_start
		binary.LittleEndian.PutUint16(out[at:], binary.LittleEndian.Uint16(out[at:])+uint16(4*len(types)))
	}
	return out
}

// TestSegmenterVLAN: a packet with one or two VLAN tags, 802.1Q or
// 802.1ad, is cut into the frames its untagged self is cut into, each
// with the tags.
func TestSegmenterVLAN(t *testing.T) {
	for _, ipv6 := range []bool{false, true} {
		plain := gsoPacket(ipv6, make([]byte, 5000), 1400, 0x10)
		want := segmentAll(t, plain, 1514)
		for _, types := range [][]uint16{{etherVLAN}, {etherQinQ}, {etherQinQ, etherVLAN}, {etherVLAN, etherVLAN}} {
			got := segmentAll(t, tagged(plain, types...), 1514+8)
			if len(got) != len(want) {
				t.Fatalf("ipv6 %v, tags %x: %d frames, want %d", ipv6, types, len(got), len(want))
			}
			for i := range got {
				untagged := append(bytes.Clone(got[i][:12]), got[i][12+4*len(types):]...)
				if !bytes.Equal(untagged, want[i]) {
					t.Errorf("ipv6 %v, tags %x: frame %d differs from the untagged packet's", ipv6, types, i)
				}
			}
		}
	}
}

// TestSegmenterPseudoHeader: the segments' checksums start from the
// pseudo-header sum the sender left in the packet, as the kernel's do: for
// an IPv6 packet with a routing header, that of its final destination, not
// of the address in the IPv6 header.
func TestSegmenterPseudoHeader(t *testing.T) {
	pkt := gsoPacket(true, make([]byte, 3000), 1400, 0x10)
	final := bytes.Repeat([]byte{0xfd, 9}, 8)
	tcpAt := helperproto.VirtioNetHdrLen + 14 + 40
	tcpLen := len(pkt) - tcpAt
	pseudo := append(append(append([]byte{}, pkt[helperproto.VirtioNetHdrLen+14+8:helperproto.VirtioNetHdrLen+14+24]...), final...), 0, 0, byte(tcpLen>>8), byte(tcpLen), 0, 0, 0, 6)
	binary.BigEndian.PutUint16(pkt[tcpAt+16:], ^checksum16(pseudo))
	for i, f := range segmentAll(t, pkt, 1514) {
		tcp := f[14+40:]
		p := append(append(append([]byte{}, f[14+8:14+24]...), final...), 0, 0, byte(len(tcp)>>8), byte(len(tcp)), 0, 0, 0, 6)
		if c := checksum16(p, tcp); c != 0 {
			t.Errorf("frame %d: TCP checksum does not verify against the final destination (%#x)", i, c)
		}
	}
}

// segmentAll cuts pkt into frames of at most limit bytes.
func segmentAll(t *testing.T, pkt []byte, limit int) [][]byte {
	t.Helper()
	var s Segmenter
	if err := s.Reset(pkt, limit); err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	dst := make([]byte, limit)
	for s.More() {
		out = append(out, bytes.Clone(dst[:s.Next(dst)]))
	}
	return out
}
