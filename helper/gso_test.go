package helper

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// tcpPacket is an Ethernet frame with an IPv4 or IPv6 header, a TCP header
// (seq, flags) and payload, its TCP checksum field holding the
// pseudo-header's sum as a sender with checksum offload leaves it.
func tcpPacket(ipv6 bool, seq uint32, flags byte, payload []byte) (pkt []byte, csumStart int) {
	eth := make([]byte, 14)
	var ip []byte
	if ipv6 {
		binary.BigEndian.PutUint16(eth[12:], 0x86dd)
		ip = make([]byte, 40)
		ip[0] = 0x60
		binary.BigEndian.PutUint16(ip[4:], uint16(20+len(payload)))
		ip[6], ip[7] = 6, 64
		copy(ip[8:], []byte{0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1})
		copy(ip[24:], []byte{0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2})
	} else {
		binary.BigEndian.PutUint16(eth[12:], 0x0800)
		ip = make([]byte, 20)
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(20+20+len(payload)))
		binary.BigEndian.PutUint16(ip[4:], 0x1234)
		ip[8], ip[9] = 64, 6
		copy(ip[12:], []byte{192, 168, 105, 1})
		copy(ip[16:], []byte{192, 168, 105, 2})
		binary.BigEndian.PutUint16(ip[10:], csumFold(csumAdd(0, ip)))
	}
	tcp := make([]byte, 20)
	binary.BigEndian.PutUint16(tcp[0:], 5201)
	binary.BigEndian.PutUint16(tcp[2:], 40000)
	binary.BigEndian.PutUint32(tcp[4:], seq)
	tcp[12], tcp[13] = 5<<4, flags
	pkt = append(append(append(eth, ip...), tcp...), payload...)
	return pkt, 14 + len(ip)
}

// checkTCPFrame checks a frame's IP and TCP checksums and lengths, and
// returns its sequence number, flags and payload.
func checkTCPFrame(t *testing.T, f []byte, ipv6 bool, csumStart int) (uint32, byte, []byte) {
	t.Helper()
	ip, tcp := f[14:csumStart], f[csumStart:]
	var sum uint32
	if ipv6 {
		if got := int(binary.BigEndian.Uint16(ip[4:])); got != len(tcp) {
			t.Fatalf("IPv6 payload length %d, segment %d", got, len(tcp))
		}
		sum = csumAdd(0, ip[8:40])
	} else {
		if got := int(binary.BigEndian.Uint16(ip[2:])); got != len(ip)+len(tcp) {
			t.Fatalf("IPv4 total length %d, frame's %d", got, len(ip)+len(tcp))
		}
		if csumFold(csumAdd(0, ip)) != 0 {
			t.Fatalf("IPv4 header checksum is wrong")
		}
		sum = csumAdd(0, ip[12:20])
	}
	sum += uint32(len(tcp)) + 6
	if csumFold(csumAdd(sum, tcp)) != 0 {
		t.Fatalf("TCP checksum is wrong")
	}
	return binary.BigEndian.Uint32(tcp[4:]), tcp[13], tcp[20:]
}

func TestSegmentTCP(t *testing.T) {
	for _, ipv6 := range []bool{false, true} {
		payload := make([]byte, 10000)
		for i := range payload {
			payload[i] = byte(rand.IntN(256))
		}
		const mss = 1448
		pkt, csumStart := tcpPacket(ipv6, 1000, 0x80|0x18|0x01, payload) // CWR, PSH, ACK, FIN
		hdr := make([]byte, VirtioNetHdrLen)
		hdr[0] = vnetFlagNeedsCsum
		hdr[1] = vnetGSOTCPv4
		if ipv6 {
			hdr[1] = vnetGSOTCPv6
		}
		binary.LittleEndian.PutUint16(hdr[4:], mss)
		binary.LittleEndian.PutUint16(hdr[6:], uint16(csumStart))
		binary.LittleEndian.PutUint16(hdr[8:], 16)
		var frames [][]byte
		err := toFrames(hdr, pkt, func(n int) ([]byte, error) {
			frames = append(frames, make([]byte, n))
			return frames[len(frames)-1], nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(frames) != (len(payload)+mss-1)/mss {
			t.Fatalf("ipv6=%v: %d frames for %d bytes at MSS %d", ipv6, len(frames), len(payload), mss)
		}
		var got []byte
		for i, f := range frames {
			seq, flags, p := checkTCPFrame(t, f, ipv6, csumStart)
			if seq != 1000+uint32(i*mss) {
				t.Errorf("frame %d: seq %d", i, seq)
			}
			last := i == len(frames)-1
			if (flags&0x01 != 0) != last || (flags&0x08 != 0) != last || (flags&0x80 != 0) != (i == 0) || flags&0x10 == 0 {
				t.Errorf("frame %d of %d: flags %#x", i, len(frames), flags)
			}
			if !last && len(p) != mss {
				t.Errorf("frame %d: %d bytes of payload", i, len(p))
			}
			got = append(got, p...)
		}
		if !bytes.Equal(got, payload) {
			t.Errorf("ipv6=%v: the segments' payloads are not the packet's", ipv6)
		}
	}
}

// A packet with a partial checksum and no segmentation gets its checksum.
func TestCompleteChecksum(t *testing.T) {
	pkt, csumStart := tcpPacket(false, 7, 0x18, []byte("hello, vm"))
	tcp := pkt[csumStart:]
	// What a sender with checksum offload leaves: the pseudo-header's sum.
	ps := csumAdd(0, pkt[14+12:14+20]) + uint32(len(tcp)) + 6
	binary.BigEndian.PutUint16(tcp[16:], ^csumFold(ps))
	hdr := make([]byte, VirtioNetHdrLen)
	hdr[0] = vnetFlagNeedsCsum
	binary.LittleEndian.PutUint16(hdr[6:], uint16(csumStart))
	binary.LittleEndian.PutUint16(hdr[8:], 16)
	var frame []byte
	if err := toFrames(hdr, pkt, func(n int) ([]byte, error) { frame = make([]byte, n); return frame, nil }); err != nil {
		t.Fatal(err)
	}
	checkTCPFrame(t, frame, false, csumStart)
}

func TestToFramesRefusesGarbage(t *testing.T) {
	hdr := make([]byte, VirtioNetHdrLen)
	hdr[1] = vnetGSOTCPv4
	binary.LittleEndian.PutUint16(hdr[4:], 1448)
	binary.LittleEndian.PutUint16(hdr[6:], 3) // csum_start inside the Ethernet header
	if err := toFrames(hdr, make([]byte, 100), func(n int) ([]byte, error) { return make([]byte, n), nil }); err == nil {
		t.Errorf("a GSO packet whose TCP header starts at 3: no error")
	}
	hdr[1] = 3 // UDP GSO: never asked for
	if err := toFrames(hdr, make([]byte, 100), func(n int) ([]byte, error) { return make([]byte, n), nil }); err == nil {
		t.Errorf("an unknown GSO type: no error")
	}
}

func BenchmarkSegmentTCP(b *testing.B) {
	payload := make([]byte, 64000)
	pkt, csumStart := tcpPacket(false, 1, 0x10, payload)
	hdr := make([]byte, VirtioNetHdrLen)
	hdr[0], hdr[1] = vnetFlagNeedsCsum, vnetGSOTCPv4
	binary.LittleEndian.PutUint16(hdr[4:], 1448)
	binary.LittleEndian.PutUint16(hdr[6:], uint16(csumStart))
	binary.LittleEndian.PutUint16(hdr[8:], 16)
	slot := make([]byte, 1514)
	b.SetBytes(int64(len(pkt)))
	for b.Loop() {
		toFrames(hdr, pkt, func(n int) ([]byte, error) { return slot[:n], nil })
	}
}
