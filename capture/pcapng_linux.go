package capture

import (
	"bufio"
	"encoding/binary"
	"io"
	"time"
)

// pcapng (draft-ietf-opsawg-pcapng), as much as a capture of a port
// needs: a section, its interfaces (Ethernet, named, nanosecond
// timestamps), enhanced packets and the interfaces' statistics. Written
// here rather than with gopacket's pcapgo, whose layers package costs 7
// ms of init in every vmnetctl process, each helper's start included
// (the tests read captures with pcapgo).

// Block types and options.
const (
	blockSection    = 0x0a0d0d0a
	blockInterface  = 0x00000001
	blockStatistics = 0x00000005
	blockPacket     = 0x00000006
	byteOrderMagic  = 0x1a2b3c4d
	optEnd          = 0
	optSHBUserAppl  = 4
	optIfName       = 2
	optIfTSResol    = 9
	optISBIfRecv    = 4
	optISBIfDrop    = 5
	linkTypeEther   = 1
)

// ngWriter writes a pcapng section, little-endian.
type ngWriter struct {
	w   *bufio.Writer
	buf []byte
}

// option is one option of a block: its code and value.
type option struct {
	code  uint16
	value []byte
}

// newNgWriter writes the section header, with app as its application.
func newNgWriter(w io.Writer, app string) (*ngWriter, error) {
	ng := &ngWriter{w: bufio.NewWriterSize(w, 256<<10)}
	body := binary.LittleEndian.AppendUint32(nil, byteOrderMagic)
	body = binary.LittleEndian.AppendUint16(body, 1) // version 1.0
	body = binary.LittleEndian.AppendUint16(body, 0)
	body = binary.LittleEndian.AppendUint64(body, ^uint64(0)) // section length: unknown
	return ng, ng.block(blockSection, body, nil, option{optSHBUserAppl, []byte(app)})
}

// addInterface adds an Ethernet interface named name, of snapLen bytes
// a packet at most, with timestamps in nanoseconds; its id is the number
// of interfaces before it.
func (ng *ngWriter) addInterface(name string, snapLen uint32) error {
	body := binary.LittleEndian.AppendUint16(nil, linkTypeEther)
	body = binary.LittleEndian.AppendUint16(body, 0)
	body = binary.LittleEndian.AppendUint32(body, snapLen)
	return ng.block(blockInterface, body, nil, option{optIfName, []byte(name)}, option{optIfTSResol, []byte{9}})
}

// writePacket writes a packet of interface iface, seen at t: its first
// len(data) bytes of length.
func (ng *ngWriter) writePacket(iface uint32, t time.Time, data []byte, length int) error {
	body := binary.LittleEndian.AppendUint32(ng.buf[:0], iface)
	body = appendTime(body, t)
	body = binary.LittleEndian.AppendUint32(body, uint32(len(data)))
	body = binary.LittleEndian.AppendUint32(body, uint32(length))
	ng.buf = body
	return ng.block(blockPacket, body, data)
}

// writeStats writes interface iface's statistics at t: the packets it
// received and those the kernel dropped.
func (ng *ngWriter) writeStats(iface uint32, t time.Time, recv, drop uint64) error {
	body := appendTime(binary.LittleEndian.AppendUint32(nil, iface), t)
	return ng.block(blockStatistics, body, nil,
		option{optISBIfRecv, binary.LittleEndian.AppendUint64(nil, recv)},
		option{optISBIfDrop, binary.LittleEndian.AppendUint64(nil, drop)})
}

// flush hands what was written to the underlying writer.
func (ng *ngWriter) flush() error { return ng.w.Flush() }

// appendTime appends t in nanoseconds, high word first.
func appendTime(b []byte, t time.Time) []byte {
	ns := uint64(t.UnixNano())
	b = binary.LittleEndian.AppendUint32(b, uint32(ns>>32))
	return binary.LittleEndian.AppendUint32(b, uint32(ns))
}

// block writes a block: its type and length, body, data padded to 32
// bits, the options (ended) if any, and the length again.
func (ng *ngWriter) block(typ uint32, body, data []byte, opts ...option) error {
	pad := func(n int) int { return (4 - n%4) % 4 }
	length := 12 + len(body) + len(data) + pad(len(data))
	for _, o := range opts {
		length += 4 + len(o.value) + pad(len(o.value))
	}
	if len(opts) > 0 {
		length += 4 // the end of options
	}
	var hdr [8]byte
	binary.LittleEndian.PutUint32(hdr[0:], typ)
	binary.LittleEndian.PutUint32(hdr[4:], uint32(length))
	ng.w.Write(hdr[:])
	ng.w.Write(body)
	var zero [4]byte
	ng.w.Write(data)
	ng.w.Write(zero[:pad(len(data))])
	for _, o := range opts {
		var oh [4]byte
		binary.LittleEndian.PutUint16(oh[0:], o.code)
		binary.LittleEndian.PutUint16(oh[2:], uint16(len(o.value)))
		ng.w.Write(oh[:])
		ng.w.Write(o.value)
		ng.w.Write(zero[:pad(len(o.value))])
	}
	if len(opts) > 0 {
		ng.w.Write(zero[:]) // opt_endofopt, length 0
	}
	_, err := ng.w.Write(hdr[4:8])
	return err
}
