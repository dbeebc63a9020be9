package rtlink

import (
	"encoding/binary"
	"testing"

	"golang.org/x/sys/unix"
)

// linkBody is a link message's body: an ifinfomsg of index and flags,
// then the attributes given as type and value.
func linkBody(index int32, flags uint32, attrs ...any) []byte {
	b := make([]byte, unix.SizeofIfInfomsg)
	binary.NativeEndian.PutUint32(b[4:], uint32(index))
	binary.NativeEndian.PutUint32(b[8:], flags)
	for i := 0; i+1 < len(attrs); i += 2 {
		v := attrs[i+1].([]byte)
		a := make([]byte, (4+len(v)+3)&^3)
		binary.NativeEndian.PutUint16(a, uint16(4+len(v)))
		binary.NativeEndian.PutUint16(a[2:], attrs[i].(uint16))
		copy(a[4:], v)
		b = append(b, a...)
	}
	return b
}

// TestParseLink: a link's name, alias, master and counters from its
// attributes, whatever their padding, and nothing from a short body.
func TestParseLink(t *testing.T) {
	stats := make([]byte, 23*8) // rtnl_link_stats64 as the kernel sends it
	for i := range 8 {
		binary.NativeEndian.PutUint64(stats[8*i:], uint64(i+1))
	}
	master := binary.NativeEndian.AppendUint32(nil, 7)
	l, ok := parseLink(linkBody(42, unix.IFF_UP|unix.IFF_LOWER_UP,
		uint16(unix.IFLA_IFNAME), []byte("vmt-1\x00"), uint16(unix.IFLA_IFALIAS), []byte("vmnetctl:tap=vmt-1@x"),
		uint16(unix.IFLA_MASTER), master, uint16(unix.IFLA_STATS64), stats))
	want := Link{Index: 42, Master: 7, Name: "vmt-1", Alias: "vmnetctl:tap=vmt-1@x", Flags: unix.IFF_UP | unix.IFF_LOWER_UP,
		Counters: Counters{RxPackets: 1, TxPackets: 2, RxBytes: 3, TxBytes: 4, RxErrors: 5, TxErrors: 6, RxDropped: 7, TxDropped: 8}}
	if !ok || l != want {
		t.Errorf("parseLink: %+v (%v), want %+v", l, ok, want)
	}
	if !l.TapCounts().Held {
		t.Errorf("a link with carrier: TapCounts not held")
	}
	if _, ok := parseLink(make([]byte, unix.SizeofIfInfomsg-1)); ok {
		t.Errorf("a body shorter than an ifinfomsg parsed")
	}
}

// FuzzParseLink: any body parses without a panic or a read past its end.
func FuzzParseLink(f *testing.F) {
	f.Add(linkBody(1, 0, uint16(unix.IFLA_IFNAME), []byte("a\x00")))
	f.Add(linkBody(2, 0, uint16(unix.IFLA_STATS64), make([]byte, 8)))
	f.Add(append(linkBody(3, 0), 0xff, 0xff, 0, 0))
	f.Add(append(linkBody(4, 0), 2, 0, 3, 0))
	f.Fuzz(func(t *testing.T, b []byte) {
		parseLink(b)
	})
}
