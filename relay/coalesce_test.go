package relay

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/vmnetctl/vmnetctl/checksum"
	"github.com/vmnetctl/vmnetctl/helperproto"
)

// onesSumRef is RFC 1071's sum, folded, not inverted: checksum16's
// (gso_test.go), independent of the checksum package the relay uses.
func onesSumRef(b []byte) uint16 { return ^checksum16(b) }

// tcpFrame is an Ethernet frame of a TCP segment with data, ACK set, and
// valid checksums: IPv4 (ID id) or IPv6, from port 1000 to 2000.
func tcpFrame(v6 bool, seq uint32, id uint16, payload []byte) []byte {
	eth := []byte{2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00}
	tcp := make([]byte, 32, 32+len(payload)) // with a timestamp option
	binary.BigEndian.PutUint16(tcp[0:], 1000)
	binary.BigEndian.PutUint16(tcp[2:], 2000)
	binary.BigEndian.PutUint32(tcp[4:], seq)
	binary.BigEndian.PutUint32(tcp[8:], 777)
	tcp[12], tcp[13] = 8<<4, tcpACK
	binary.BigEndian.PutUint16(tcp[14:], 512)
	copy(tcp[20:], []byte{1, 1, 8, 10, 0, 0, 0, 9, 0, 0, 0, 8})
	tcp = append(tcp, payload...)
	var ip []byte
	if v6 {
		eth[12], eth[13] = 0x86, 0xdd
		ip = make([]byte, 40)
		ip[0] = 0x60
		binary.BigEndian.PutUint16(ip[4:], uint16(len(tcp)))
		ip[6], ip[7] = protoTCP, 64
		ip[8], ip[23] = 0xfd, 1
		ip[24], ip[39] = 0xfd, 2
	} else {
		ip = []byte{0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, protoTCP, 0, 0, 10, 0, 0, 2, 10, 0, 0, 1}
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(tcp)))
		binary.BigEndian.PutUint16(ip[4:], id)
	}
	f := append(append(eth, ip...), tcp...)
	fixChecksums(f)
	return f
}

// fixChecksums makes the checksums of a frame from tcpFrame valid again
// after a change.
func fixChecksums(f []byte) {
	ip := f[EthHeaderLen:]
	var l4 int
	var pseudo uint64
	if ip[0]>>4 == 6 {
		l4 = 40
		pseudo = uint64(onesSumRef(ip[8:40]))
	} else {
		l4 = int(ip[0]&0xf) * 4
		ip[10], ip[11] = 0, 0
		binary.BigEndian.PutUint16(ip[10:], ^onesSumRef(ip[:l4]))
		pseudo = uint64(onesSumRef(ip[12:20]))
	}
	tcp := ip[l4:]
	tcp[16], tcp[17] = 0, 0
	binary.BigEndian.PutUint16(tcp[16:], ^checksum.Fold(pseudo+uint64(len(tcp))+protoTCP+uint64(onesSumRef(tcp))))
}

// written is what a coalescer wrote, with a header each.
type written struct {
	packets [][]byte
	// refuse, if set, says which writes the TAP refuses.
	refuse func(b []byte) bool
}

func (w *written) write(b []byte) bool {
	w.packets = append(w.packets, bytes.Clone(b))
	return w.refuse == nil || !w.refuse(b)
}

func withHeader(frames [][]byte) [][]byte {
	var hf [][]byte
	for _, f := range frames {
		hf = append(hf, append(make([]byte, helperproto.VirtioNetHdrLen), f...))
	}
	return hf
}

// nextID numbers the IPv4 frames segments makes, one up each, across
// calls: a flow made in two calls counts on, so that the ID's check does
// not end a run that another check should.
var nextID uint16

// segments is a flow's frames: n segments of mss bytes from seq, then one
// of last bytes if last > 0. Each payload byte is its sequence number's
// low byte, so a misplaced byte shows.
func segments(v6 bool, seq uint32, n, mss, last int) [][]byte {
	var fs [][]byte
	for i := 0; i <= n; i++ {
		size := mss
		if i == n {
			if last == 0 {
				break
			}
			size = last
		}
		p := make([]byte, size)
		for j := range p {
			p[j] = byte(seq + uint32(j))
		}
		fs = append(fs, tcpFrame(v6, seq, nextID, p))
		nextID++
		seq += uint32(size)
	}
	return fs
}

// resegment cuts a merged packet (behind its header) back into the frames
// it stands for, as the kernel does when it forwards it: the first frame's
// headers with each segment's sequence number, lengths, IPv4 ID (counting
// up) and checksums.
func resegment(t *testing.T, pkt []byte) [][]byte {
	t.Helper()
	h, f := pkt[:helperproto.VirtioNetHdrLen], pkt[helperproto.VirtioNetHdrLen:]
	if h[0] != vnetNeedsCsum || (h[1] != gsoTCPv4 && h[1] != gsoTCPv6) {
		t.Fatalf("merged packet's header %x", h)
	}
	hdrLen, mss := int(binary.LittleEndian.Uint16(h[2:])), int(binary.LittleEndian.Uint16(h[4:]))
	l4, off := int(binary.LittleEndian.Uint16(h[6:])), int(binary.LittleEndian.Uint16(h[8:]))
	if off != 16 || l4 >= hdrLen || hdrLen > len(f) || mss == 0 {
		t.Fatalf("merged packet's header %x", h)
	}
	// The checksum field holds the pseudo-header's sum over the whole
	// segment.
	ip := f[EthHeaderLen:]
	var pseudo uint64
	if h[1] == gsoTCPv6 {
		pseudo = uint64(onesSumRef(ip[8:40]))
		if int(binary.BigEndian.Uint16(ip[4:]))+40 != len(ip) {
			t.Fatalf("IPv6 payload length %d for %d bytes", binary.BigEndian.Uint16(ip[4:]), len(ip))
		}
	} else {
		pseudo = uint64(onesSumRef(ip[12:20]))
		if int(binary.BigEndian.Uint16(ip[2:])) != len(ip) || onesSumRef(ip[:20]) != 0xffff {
			t.Fatalf("IPv4 header %x of a %d byte packet", ip[:20], len(ip))
		}
	}
	if got, want := binary.BigEndian.Uint16(f[l4+16:]), checksum.Fold(pseudo+uint64(len(f)-l4)+protoTCP); got != want {
		t.Fatalf("TCP checksum field %#04x, want the pseudo-header's %#04x", got, want)
	}
	seq := binary.BigEndian.Uint32(f[l4+4:])
	id := binary.BigEndian.Uint16(ip[4:])
	var out [][]byte
	for at, i := hdrLen, 0; at < len(f); at, i = at+mss, i+1 {
		end := min(at+mss, len(f))
		s := append(bytes.Clone(f[:hdrLen]), f[at:end]...)
		sip := s[EthHeaderLen:]
		if h[1] == gsoTCPv6 {
			binary.BigEndian.PutUint16(sip[4:], uint16(len(sip)-40))
		} else {
			binary.BigEndian.PutUint16(sip[2:], uint16(len(sip)))
			binary.BigEndian.PutUint16(sip[4:], id+uint16(i))
		}
		binary.BigEndian.PutUint32(s[l4+4:], seq+uint32(at-hdrLen))
		if end < len(f) {
			s[l4+13] &^= tcpPSH
		}
		fixChecksums(s)
		out = append(out, s)
	}
	return out
}

// check runs frames through a coalescer and compares what it wrote with
// want: for each packet written, how many of the frames it stands for.
func check(t *testing.T, frames [][]byte, want []int) {
	t.Helper()
	var w written
	packets, size, drops := NewCoalescer().Write(withHeader(frames), w.write)
	var total uint64
	for _, f := range frames {
		total += uint64(len(f))
	}
	if packets != uint64(len(frames)) || size != total || drops != 0 {
		t.Errorf("counted %d frames, %d bytes, %d drops; want %d, %d, 0", packets, size, drops, len(frames), total)
	}
	var got []int
	next := 0
	for _, p := range w.packets {
		if p[1] == 0 { // a frame as it came
			if !bytes.Equal(p[:helperproto.VirtioNetHdrLen], make([]byte, helperproto.VirtioNetHdrLen)) || next >= len(frames) || !bytes.Equal(p[helperproto.VirtioNetHdrLen:], frames[next]) {
				t.Fatalf("packet %d is not frame %d behind an empty header", len(got), next)
			}
			got = append(got, 1)
			next++
			continue
		}
		segs := resegment(t, p)
		for i, s := range segs {
			if next+i >= len(frames) || !bytes.Equal(s, frames[next+i]) {
				t.Fatalf("packet %d's segment %d is not frame %d:\n%x\n%x", len(got), i, next+i, s, frames[min(next+i, len(frames)-1)])
			}
		}
		got = append(got, len(segs))
		next += len(segs)
	}
	if !slicesEqual(got, want) {
		t.Errorf("wrote packets of %v frames, want %v", got, want)
	}
}

func slicesEqual(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// change returns f changed by edit, with valid checksums again.
func change(f []byte, edit func(f []byte)) []byte {
	f = bytes.Clone(f)
	edit(f)
	fixChecksums(f)
	return f
}

const (
	ipv4 = false
	ipv6 = true
	// tcp4 is where TCP begins in tcpFrame's IPv4 frames.
	tcp4 = EthHeaderLen + 20
)

func TestCoalesce(t *testing.T) {
	flow := segments(ipv4, 1000, 5, 1448, 300)
	other := segments(ipv4, 9000, 3, 1448, 0)
	for i := range other {
		other[i] = change(other[i], func(f []byte) { f[tcp4+1]++ }) // another source port
	}
	for _, tt := range []struct {
		name   string
		frames [][]byte
		want   []int
	}{
		{"a run and its short last segment", flow, []int{6}},
		{"IPv6", segments(ipv6, 5, 7, 1000, 0), []int{7}},
		{"one segment", flow[:1], []int{1}},
		{"a short segment ends the run", append(segments(ipv4, 1000, 1, 1448, 100), segments(ipv4, 2548, 2, 1448, 0)...), []int{2, 2}},
		{"a bigger segment after a small one", append(segments(ipv4, 0, 0, 1448, 100), segments(ipv4, 100, 3, 1448, 0)...), []int{1, 3}},
		{"IPv6: a short segment ends the run", append(segments(ipv6, 1000, 1, 1448, 100), segments(ipv6, 2548, 2, 1448, 0)...), []int{2, 2}},
		{"IPv6: a bigger segment after a small one", append(segments(ipv6, 0, 0, 1448, 100), segments(ipv6, 100, 3, 1448, 0)...), []int{1, 3}},
		{"PSH ends the run", func() [][]byte {
			fs := segments(ipv4, 1000, 5, 1448, 0)
			fs[2] = change(fs[2], func(f []byte) { f[tcp4+13] |= tcpPSH })
			return fs
		}(), []int{3, 2}},
		{"a gap in the sequence", append(segments(ipv4, 1000, 2, 1448, 0), segments(ipv4, 1000+3*1448, 2, 1448, 0)...), []int{2, 2}},
		{"a repeated segment", append(segments(ipv4, 1000, 2, 1448, 0), segments(ipv4, 1000+1448, 2, 1448, 0)...), []int{2, 2}},
		{"interleaved flows", [][]byte{flow[0], flow[1], other[0], flow[2], other[1], other[2]}, []int{2, 1, 1, 2}},
		{"64 KiB at most", segments(ipv4, 0, 60, 1448, 0), []int{45, 15}},
		{"IPv4 and IPv6", append(segments(ipv4, 0, 2, 1000, 0), segments(ipv6, 2000, 2, 1000, 0)...), []int{2, 2}},
	} {
		t.Run(tt.name, func(t *testing.T) { check(t, tt.frames, tt.want) })
	}

	// Whatever Linux's GRO would not merge, or a header that differs,
	// keeps a segment out of a run: the third of five.
	for _, tt := range []struct {
		name string
		edit func(f []byte)
	}{
		{"SYN", func(f []byte) { f[tcp4+13] |= 0x02 }},
		{"FIN", func(f []byte) { f[tcp4+13] |= 0x01 }},
		{"RST", func(f []byte) { f[tcp4+13] = 0x04 | tcpACK }},
		{"URG", func(f []byte) { f[tcp4+13] |= 0x20; f[tcp4+19] = 1 }},
		{"an urgent pointer", func(f []byte) { f[tcp4+19] = 1 }},
		{"ECE", func(f []byte) { f[tcp4+13] |= 0x40 }},
		{"CWR", func(f []byte) { f[tcp4+13] |= 0x80 }},
		{"no ACK", func(f []byte) { f[tcp4+13] = tcpPSH }},
		{"another acknowledgement", func(f []byte) { f[tcp4+11]++ }},
		{"another window", func(f []byte) { f[tcp4+15]++ }},
		{"another timestamp", func(f []byte) { f[tcp4+27]++ }},
		{"another TTL", func(f []byte) { f[EthHeaderLen+8]-- }},
		{"another TOS", func(f []byte) { f[EthHeaderLen+1] = 2 }},
		{"without DF", func(f []byte) { f[EthHeaderLen+6] = 0 }},
		{"a fragment", func(f []byte) { f[EthHeaderLen+6] |= 0x20 }},
		{"another source", func(f []byte) { f[EthHeaderLen+15]++ }},
		{"another destination", func(f []byte) { f[EthHeaderLen+19]++ }},
		{"another source MAC", func(f []byte) { f[11]++ }},
		{"another destination MAC", func(f []byte) { f[5]++ }},
		{"UDP", func(f []byte) { f[EthHeaderLen+9] = 17 }},
		{"reserved TCP bits", func(f []byte) { f[tcp4+12] |= 1 }},
		{"an IPv4 ID out of turn", func(f []byte) { f[EthHeaderLen+5]++ }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fs := segments(ipv4, 1000, 5, 1448, 0)
			fs[2] = change(fs[2], tt.edit)
			check(t, fs, []int{2, 1, 2})
		})
	}

	// The same for IPv6's header.
	for _, tt := range []struct {
		name string
		edit func(f []byte)
	}{
		{"another traffic class", func(f []byte) { f[EthHeaderLen] |= 0x01 }},
		{"another flow label", func(f []byte) { f[EthHeaderLen+3]++ }},
		{"another hop limit", func(f []byte) { f[EthHeaderLen+7]-- }},
		{"another source", func(f []byte) { f[EthHeaderLen+23]++ }},
		{"another destination", func(f []byte) { f[EthHeaderLen+39]++ }},
	} {
		t.Run("IPv6: "+tt.name, func(t *testing.T) {
			fs := segments(ipv6, 1000, 5, 1448, 0)
			fs[2] = change(fs[2], tt.edit)
			check(t, fs, []int{2, 1, 2})
		})
	}

	// What parseSegment refuses is refused even when every frame of a
	// run has it alike.
	for _, tt := range []struct {
		name string
		v6   bool
		edit func(f []byte)
	}{
		{"fragments", ipv4, func(f []byte) { f[EthHeaderLen+6] |= 0x20 }},
		{"urgent data", ipv4, func(f []byte) { f[tcp4+19] = 1 }},
		{"IPv6: another next header", ipv6, func(f []byte) { f[EthHeaderLen+6] = 17 }},
		{"IPv6: version 4", ipv6, func(f []byte) { f[EthHeaderLen] = 0x40 }},
	} {
		t.Run("every frame: "+tt.name, func(t *testing.T) {
			fs := segments(tt.v6, 1000, 3, 1448, 0)
			for i := range fs {
				fs[i] = change(fs[i], tt.edit)
			}
			check(t, fs, []int{1, 1, 1})
		})
	}

	// A segment that fails a checksum is written alone, for the kernel to
	// judge; one whose lengths disagree with the frame is never merged.
	for _, tt := range []struct {
		name string
		edit func(f []byte)
	}{
		{"a bad TCP checksum", func(f []byte) { f[len(f)-1]++ }},
		{"a bad IPv4 header checksum", func(f []byte) { f[EthHeaderLen+10]++ }},
		{"a frame longer than its IP packet", func(f []byte) {}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fs := segments(ipv4, 1000, 5, 1448, 0)
			if tt.name == "a frame longer than its IP packet" {
				fs[2] = append(fs[2], 0)
			} else {
				fs[2] = bytes.Clone(fs[2])
				tt.edit(fs[2])
			}
			check(t, fs, []int{2, 1, 2})
		})
	}
	t.Run("a bad checksum on the first", func(t *testing.T) {
		fs := segments(ipv4, 1000, 3, 1448, 0)
		fs[0][len(fs[0])-1]++
		check(t, fs, []int{1, 2})
	})
	t.Run("IPv4 options", func(t *testing.T) {
		fs := segments(ipv4, 1000, 3, 1448, 0)
		f := fs[1]
		opt := append(append(bytes.Clone(f[:tcp4]), 1, 1, 1, 0), f[tcp4:]...) // three NOPs and EOL
		opt[EthHeaderLen] = 0x46
		binary.BigEndian.PutUint16(opt[EthHeaderLen+2:], uint16(len(opt)-EthHeaderLen))
		fixChecksums(opt)
		fs[1] = opt
		check(t, fs, []int{1, 1, 1})
	})

	// A TAP that refuses the merged packet gets the frames one by one.
	for _, tt := range []struct {
		name          string
		refuse        func(b []byte) bool
		packets, drop int
	}{
		{"the TAP refuses merged packets", func(b []byte) bool { return b[1] != 0 }, len(flow), 0},
		{"the TAP refuses every packet", func([]byte) bool { return true }, 0, len(flow)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := written{refuse: tt.refuse}
			packets, _, drops := NewCoalescer().Write(withHeader(flow), w.write)
			if packets != uint64(tt.packets) || drops != uint64(tt.drop) || len(w.packets) != 1+len(flow) {
				t.Errorf("%d packets, %d drops in %d writes; want %d, %d in %d", packets, drops, len(w.packets), tt.packets, tt.drop, 1+len(flow))
			}
			for i, p := range w.packets[1:] {
				if !bytes.Equal(p[helperproto.VirtioNetHdrLen:], flow[i]) || p[1] != 0 {
					t.Errorf("write %d after the refusal is not frame %d alone", i+1, i)
				}
			}
		})
	}
}

// FuzzCoalesce: frames cut from any bytes, and runs of valid segments
// changed anywhere, are written whole and in order, each once, and a
// merged packet cuts back into exactly the frames it merged.
func FuzzCoalesce(f *testing.F) {
	f.Add([]byte{}, uint16(0), byte(0))
	f.Add(bytes.Repeat([]byte{0x45}, 200), uint16(3), byte(1))
	f.Fuzz(func(t *testing.T, junk []byte, at uint16, b byte) {
		frames := segments(ipv4, 1, 4, 700, 50)
		frames = append(frames, segments(ipv6, 7, 4, 600, 0)...)
		// One byte changed, anywhere in the valid frames, checksums kept
		// or fixed.
		k := int(at) % len(frames)
		fr := bytes.Clone(frames[k])
		fr[int(at)%len(fr)] ^= b
		if at&1 == 0 {
			fixChecksums(fr)
		}
		frames[k] = fr
		// And frames made of the junk.
		for len(junk) > 0 {
			n := min(len(junk), 14+int(junk[0]))
			frames = append(frames, junk[:n])
			junk = junk[n:]
		}
		var w written
		packets, _, drops := NewCoalescer().Write(withHeader(frames), w.write)
		if packets != uint64(len(frames)) || drops != 0 {
			t.Fatalf("%d packets, %d drops for %d frames", packets, drops, len(frames))
		}
		next := 0
		for _, p := range w.packets {
			if p[1] == 0 {
				if !bytes.Equal(p[helperproto.VirtioNetHdrLen:], frames[next]) {
					t.Fatalf("frame %d changed", next)
				}
				next++
				continue
			}
			for _, s := range resegment(t, p) {
				if !bytes.Equal(s, frames[next]) {
					t.Fatalf("frame %d merged wrongly:\n%x\n%x", next, s, frames[next])
				}
				next++
			}
		}
		if next != len(frames) {
			t.Fatalf("wrote %d of %d frames", next, len(frames))
		}
	})
}
