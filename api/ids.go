package api

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// The names and identifiers derived from a network or an attachment, each
// in one place: the controller, the helpers, the backends and the tests all
// call these.

// ValidInterfaceID reports whether id is a UUID, any case, as vmnet-helper's
// --interface-id must be: 8-4-4-4-12 hexadecimal digits.
func ValidInterfaceID(id string) bool {
	if len(id) != 36 {
		return false
	}
	for i := range len(id) {
		c := id[i]
		switch {
		case i == 8 || i == 13 || i == 18 || i == 23:
			if c != '-' {
				return false
			}
		case !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'):
			return false
		}
	}
	return true
}

// CheckInterfaceID reports why id cannot be an --interface-id.
func CheckInterfaceID(id string) error {
	if !ValidInterfaceID(id) {
		return fmt.Errorf("--interface-id %q is not a UUID (like 2835E074-9892-4A79-AFFB-7E41D2605678)", id)
	}
	return nil
}

// InterfaceID is the --interface-id of the helper of attachment index of vm
// with the given MAC: an uppercase UUID (vmnet-helper's style) from SHA-256
// of the three, with version 5 and RFC 4122 variant bits. vmnetctl's helper
// and vmnet-helper get the same id, so an attachment keeps its helper-side
// MAC address across restarts on both platforms.
func InterfaceID(vm string, index int, mac string) string {
	u := interfaceUUID(vm, index, mac)
	return formatUUID(u[:])
}

// interfaceUUID is InterfaceID's 16 bytes.
func interfaceUUID(vm string, index int, mac string) [16]byte {
	var in [128]byte
	b := append(in[:0], "vmnetctl/"...)
	b = append(b, vm...)
	b = append(b, '/')
	b = strconv.AppendInt(b, int64(index), 10)
	b = append(b, '/')
	b = append(b, mac...)
	sum := sha256.Sum256(b)
	sum[6] = sum[6]&0x0f | 0x50
	sum[8] = sum[8]&0x3f | 0x80
	return [16]byte(sum[:16])
}

// AttachmentTapName is TapName(InterfaceID(vm, index, mac)), the TAP of
// an attachment's helper, at one allocation (the name): a pass asks it
// of every attachment of a network whose claims change.
func AttachmentTapName(vm string, index int, mac string) string {
	var in [13 + 36]byte
	b := append(in[:0], "vmnetctl/tap/"...)
	u := interfaceUUID(vm, index, mac)
	b = appendUUID(b, u[:], lowerHex)
	sum := sha256.Sum256(b)
	var out [len(TapPrefix) + 10]byte
	copy(out[:], TapPrefix)
	hex.Encode(out[len(TapPrefix):], sum[:5])
	return string(out[:])
}

// NewInterfaceID returns a random (version 4) UUID, for a helper started
// without --interface-id.
func NewInterfaceID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return formatUUID(b[:])
}

const (
	upperHex = "0123456789ABCDEF"
	lowerHex = "0123456789abcdef"
)

func formatUUID(b []byte) string {
	return string(appendUUID(make([]byte, 0, 36), b, upperHex))
}

// appendUUID appends the 8-4-4-4-12 form of the 16 bytes of b, in the
// digits given.
func appendUUID(out, b []byte, digits string) []byte {
	for i, c := range b[:16] {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			out = append(out, '-')
		}
		out = append(out, digits[c>>4], digits[c&0x0f])
	}
	return out
}

// InterfaceMAC derives the VM's MAC address from an interface id, as vmnet
// does: a locally administered unicast address from SHA-256 of the id
// (case-insensitive, as UUIDs are), so one id gives one MAC on every run
// and machine.
func InterfaceMAC(id string) net.HardwareAddr {
	sum := sha256.Sum256([]byte("vmnetctl/helper/" + strings.ToLower(id)))
	mac := net.HardwareAddr(sum[:6:6])
	mac[0] = mac[0]&^0x01 | 0x02
	return mac
}

// TapPrefix starts the name of every TAP a helper creates.
const TapPrefix = "vmt-"

// TapName is the TAP of an interface id: "vmt-" and ten hex digits of its
// SHA-256 (14 bytes, within IFNAMSIZ). One id, one TAP: a second helper for
// the same id fails instead of sharing the interface.
func TapName(interfaceID string) string {
	sum := sha256.Sum256([]byte("vmnetctl/tap/" + strings.ToLower(interfaceID)))
	return TapPrefix + hex.EncodeToString(sum[:5])
}

// SubnetMask is the dotted IPv4 mask of p (vmnet-helper's --subnet-mask),
// or the zero Addr when p is not an IPv4 prefix.
func SubnetMask(p netip.Prefix) netip.Addr {
	if !p.IsValid() || !p.Addr().Is4() {
		return netip.Addr{}
	}
	return netip.AddrFrom4([4]byte(net.CIDRMask(p.Bits(), 32)))
}
