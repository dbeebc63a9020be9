package rtlink

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
)

// linkBody is a link message's body: an ifinfomsg of index and flags,
// then the attributes given as type and value.
func linkBody(index int32, flags uint32, attrs ...any) []byte {
	b := make([]byte, unix.SizeofIfInfomsg)
	binary.NativeEndian.PutUint32(b[4:], uint32(index))
	binary.NativeEndian.PutUint32(b[8:], flags)
	return appendAttrs(b, attrs...)
}

// appendAttrs appends the attributes given as type and value to b, each
// padded to 4 bytes.
func appendAttrs(b []byte, attrs ...any) []byte {
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

// addrBody is an address message's body: an ifaddrmsg of family, prefix
// length and index, then the attributes given as type and value.
func addrBody(family, bits uint8, index uint32, attrs ...any) []byte {
	b := make([]byte, unix.SizeofIfAddrmsg)
	b[0], b[1] = family, bits
	binary.NativeEndian.PutUint32(b[4:], index)
	return appendAttrs(b, attrs...)
}

// TestParseAddr: IPv4's address from IFA_LOCAL and IFA_ADDRESS, a peer's
// where they differ; IPv6's from IFA_ADDRESS alone; flags from IFA_FLAGS
// over the header's; nothing from a short body or one without an address.
func TestParseAddr(t *testing.T) {
	ip := func(s string) []byte { return netip.MustParseAddr(s).AsSlice() }
	flags := binary.NativeEndian.AppendUint32(nil, unix.IFA_F_NODAD|unix.IFA_F_PERMANENT)
	for _, tc := range []struct {
		name string
		body []byte
		want Addr
		ok   bool
	}{
		{"ipv4", addrBody(unix.AF_INET, 24, 3, uint16(unix.IFA_ADDRESS), ip("10.0.0.1"), uint16(unix.IFA_LOCAL), ip("10.0.0.1"), uint16(unix.IFA_LABEL), []byte("br0\x00")),
			Addr{Prefix: netip.MustParsePrefix("10.0.0.1/24"), Label: "br0"}, true},
		{"ipv4 peer", addrBody(unix.AF_INET, 32, 3, uint16(unix.IFA_ADDRESS), ip("10.0.1.2"), uint16(unix.IFA_LOCAL), ip("10.0.1.1")),
			Addr{Prefix: netip.MustParsePrefix("10.0.1.1/32"), Peer: netip.MustParsePrefix("10.0.1.2/32")}, true},
		{"ipv6", addrBody(unix.AF_INET6, 64, 3, uint16(unix.IFA_ADDRESS), ip("fd00::1"), uint16(unix.IFA_FLAGS), flags),
			Addr{Prefix: netip.MustParsePrefix("fd00::1/64"), Flags: unix.IFA_F_NODAD | unix.IFA_F_PERMANENT}, true},
		{"short", make([]byte, unix.SizeofIfAddrmsg-1), Addr{}, false},
		{"no address", addrBody(unix.AF_INET6, 64, 3), Addr{Prefix: netip.PrefixFrom(netip.Addr{}, 64)}, false},
	} {
		got, ok := parseAddr(tc.body)
		if ok != tc.ok || (ok && got != tc.want) {
			t.Errorf("%s: %+v %v, want %+v %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

// TestParseLinkAllocates: a link's counters and master are read without
// allocating (a relay reads its TAP's every few seconds).
func TestParseLinkAllocates(t *testing.T) {
	body := linkBody(42, unix.IFF_UP, uint16(unix.IFLA_MASTER), binary.NativeEndian.AppendUint32(nil, 7), uint16(unix.IFLA_STATS64), make([]byte, 23*8))
	if n := testing.AllocsPerRun(100, func() { parseLink(body) }); n != 0 {
		t.Errorf("parseLink allocates %v times", n)
	}
}
