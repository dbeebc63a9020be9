// Package checksum is the Internet checksum (RFC 1071) that IPv4 headers,
// TCP, UDP and ICMPv6 carry, computed 64 bits at a time.
package checksum

import (
	"encoding/binary"
	"math/bits"
)

// Add adds b to sum as big-endian 16-bit words (RFC 1071). It adds 64
// bits at a time in the machine's order and swaps the folded result, which
// the one's complement sum allows (RFC 1071, 2.(B)).
func Add(sum uint64, b []byte) uint64 {
	var acc, carry uint64
	for len(b) >= 32 {
		acc, carry = bits.Add64(acc, binary.LittleEndian.Uint64(b), carry)
		acc, carry = bits.Add64(acc, binary.LittleEndian.Uint64(b[8:]), carry)
		acc, carry = bits.Add64(acc, binary.LittleEndian.Uint64(b[16:]), carry)
		acc, carry = bits.Add64(acc, binary.LittleEndian.Uint64(b[24:]), carry)
		b = b[32:]
	}
	for len(b) >= 8 {
		acc, carry = bits.Add64(acc, binary.LittleEndian.Uint64(b), carry)
		b = b[8:]
	}
	acc, carry = bits.Add64(acc, 0, carry)
	acc += carry // at most 1, and acc cannot overflow again after a carry out
	var tail uint64
	if len(b) >= 4 {
		tail = uint64(binary.LittleEndian.Uint32(b))
		b = b[4:]
	}
	if len(b) >= 2 {
		tail += uint64(binary.LittleEndian.Uint16(b)) << 32
		b = b[2:]
	}
	if len(b) == 1 {
		tail += uint64(b[0]) << 48
	}
	// Fold the little-endian sums to 16 bits, then swap into big-endian.
	le := uint64(Fold(acc>>32+acc&0xffffffff)) + uint64(Fold(tail))
	return sum + uint64(bits.ReverseBytes16(Fold(le)))
}

// Of is the Internet checksum (RFC 1071) of parts one after the
// other, each but the last of even length: an IPv4 header's, or a UDP
// datagram's with its pseudo-header first.
func Of(parts ...[]byte) uint16 {
	var sum uint64
	for _, p := range parts {
		sum = Add(sum, p)
	}
	return ^Fold(sum)
}

// Fold folds a sum of 16-bit words to 16 bits.
func Fold(sum uint64) uint16 {
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return uint16(sum)
}
