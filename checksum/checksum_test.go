package checksum

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// ref is RFC 1071's sum, folded, not inverted, two bytes at a time as
// the RFC writes it: for Add to agree with.
func ref(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return uint16(sum)
}

// TestAdd: the sum 64 bits at a time agrees with the RFC's, whatever the
// length and alignment, with every carry, and from an initial sum; Of
// is its complement.
func TestAdd(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 3000)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	all := bytes.Repeat([]byte{0xff}, 3000) // every carry there is
	for _, b := range [][]byte{buf, all} {
		for n := range 300 {
			for _, off := range []int{0, 1, 3, 7} {
				p := b[off : off+n]
				if got, want := Fold(Add(0, p)), ref(p); got != want {
					t.Fatalf("len %d at %d: %#04x, want %#04x", n, off, got, want)
				}
			}
		}
		if got, want := Fold(Add(0x1234, b[:1448])), Fold(0x1234+uint64(ref(b[:1448]))); got != want {
			t.Fatalf("with an initial sum: %#04x, want %#04x", got, want)
		}
	}
}

func TestOf(t *testing.T) {
	// An IPv4 header (RFC 1071's example is not one; this is a real one)
	// whose checksum field holds its checksum sums to 0.
	hdr := []byte{0x45, 0, 0, 0x73, 0, 0, 0x40, 0, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8, 0, 1, 0xc0, 0xa8, 0, 0xc7}
	if c := Of(hdr); c != 0 {
		t.Errorf("a header with its checksum: %#04x, want 0", c)
	}
	hdr[10], hdr[11] = 0, 0
	if c := Of(hdr[:10], hdr[10:]); c != 0xb861 {
		t.Errorf("the header's checksum in two parts: %#04x, want 0xb861", c)
	}
}
