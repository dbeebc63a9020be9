package hostnet

import (
	"iter"

	"golang.org/x/sys/unix"
)

// Attrs walks the netlink attributes in b, in place: route attributes
// (rtattr) and the others (nlattr) have one layout, a length and a type
// of 16 bits each, the value, then padding to 4 bytes. It yields each
// attribute's type as it is (flags and all) and its value, and stops at
// the first malformed one. Dumps of thousands read with it make no
// garbage a message (BriefLinks; the controller's watch of nftables).
func Attrs(b []byte) iter.Seq2[uint16, []byte] {
	return func(yield func(uint16, []byte) bool) {
		for b := b; len(b) >= unix.SizeofNlAttr; {
			n := int(native.Uint16(b[0:2]))
			if n < unix.SizeofNlAttr || n > len(b) {
				return
			}
			if !yield(native.Uint16(b[2:4]), b[unix.SizeofNlAttr:n]) {
				return
			}
			b = b[min(len(b), (n+unix.NLA_ALIGNTO-1)&^(unix.NLA_ALIGNTO-1)):]
		}
	}
}
