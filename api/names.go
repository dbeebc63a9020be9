package api

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
)

// MaxIfNameLen is the longest Linux interface name (IFNAMSIZ - 1).
const MaxIfNameLen = 15

// nameRe is what network and VM names may look like: they become parts of
// interface names, file names and command lines, so no spaces, slashes,
// shell metacharacters or leading dashes.
var nameRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`) })

// checkName returns why s cannot be a network or VM name, or "".
func checkName(s string) string {
	switch {
	case s == "":
		return "must not be empty"
	case len(s) > 63:
		return fmt.Sprintf("%q is longer than 63 characters", s)
	case !nameRe().MatchString(s):
		return fmt.Sprintf("%q may only contain letters, digits, '-', '_' and '.', and must start with a letter or digit", s)
	}
	return ""
}

// vmNameRe is a VM name: a DNS label, since the VM answers to
// NAME.vmnet.internal (with '_', which vmnetctl's DNS proxy also serves).
var vmNameRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9_-]{0,61}[A-Za-z0-9])?$`) })

// HostNameChar tells whether r may be in a host name's label, as the DNS
// proxy answers them and DHCP keeps a client's: an ASCII letter or digit,
// '-' or '_' (what vmNameRe allows).
func HostNameChar(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_'
}

// checkVMName returns why s cannot be a VM name, or "": a VM's own rule
// whatever is wrong (a network's allows dots, a VM's does not).
func checkVMName(s string) string {
	switch {
	case s == "":
		return "must not be empty"
	case len(s) > 63:
		return fmt.Sprintf("%q is longer than 63 characters", s)
	case !vmNameRe().MatchString(s):
		return fmt.Sprintf("%q is not a DNS label (the VM's name in DNS): letters, digits, '-' and '_' only (no dots), starting and ending with a letter or digit", s)
	}
	return ""
}

// checkIfName returns why s cannot be a host interface name, or "".
func checkIfName(s string) string {
	switch {
	case s == "":
		return "must not be empty"
	case len(s) > MaxIfNameLen:
		return fmt.Sprintf("%q is longer than %d characters, the limit for interface names", s, MaxIfNameLen)
	case s == "." || s == "..":
		return fmt.Sprintf("%q is not an interface name", s)
	case strings.HasPrefix(s, "-"):
		return fmt.Sprintf("%q must not start with '-'", s)
	}
	for _, r := range s {
		if r <= ' ' || r >= 0x7f || r == '/' || r == ':' || strings.ContainsRune("\"'`$\\;&|<>()*?[]{}!#~", r) {
			return fmt.Sprintf("%q contains %q, which an interface name cannot hold", s, r)
		}
	}
	return ""
}

// BridgePrefix starts the name of every bridge vmnetctl creates.
const BridgePrefix = "vmn-"

// BridgeName is the deterministic name of the Linux bridge for a network id:
// "vmn-" and the id when that fits in 15 characters, else "vmn-", the first
// four characters of the id, "-" and six hex digits of its SHA-256.
func BridgeName(networkID string) string {
	if len(BridgePrefix)+len(networkID) <= MaxIfNameLen && checkIfName(BridgePrefix+networkID) == "" {
		return BridgePrefix + networkID
	}
	sum := sha256.Sum256([]byte(networkID))
	head := networkID
	if len(head) > 4 {
		head = head[:4]
	}
	return BridgePrefix + head + "-" + hex.EncodeToString(sum[:3])
}

// VXLANPrefix starts the name of a network's VXLAN device (a network across
// hosts), on its bridge.
const VXLANPrefix = "vmx-"

// ShaperPrefix starts the name of the IFB device that shapes what the VM
// of a port with a bandwidth limit sends (ShaperName).
const ShaperPrefix = "vmb-"

// ShaperName is the IFB device of port: what the VM sends through port is
// redirected to it, and its queue holds to the limit.
func ShaperName(port string) string {
	sum := sha256.Sum256([]byte("vmnetctl/shaper/" + port))
	return ShaperPrefix + hex.EncodeToString(sum[:5])
}

// TmpBridgePrefix starts the temporary name under which a bridge or VXLAN
// device is created, then marked and renamed (netplane).
const TmpBridgePrefix = "vmn."

// OwnInterface reports whether an interface name is of a form vmnetctl
// gives its own interfaces (bridges, TAPs, VXLAN devices, temporaries), so
// not one a user can bridge a network onto.
func OwnInterface(name string) bool {
	for _, p := range []string{BridgePrefix, TapPrefix, VXLANPrefix, TmpBridgePrefix, WireGuardPrefix, ShaperPrefix} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// VXLANName is the VXLAN device of network networkID: its bridge's name
// with VXLANPrefix for BridgePrefix.
func VXLANName(networkID string) string {
	return VXLANPrefix + strings.TrimPrefix(BridgeName(networkID), BridgePrefix)
}

// DeriveMAC returns the MAC address vmnetctl gives the index'th network entry
// of a VM that names none: 52 (locally administered, unicast) and five
// bytes of SHA-256 of the VM name and index, 40 bits: two of 10,000 VMs
// share one about once in 20,000 state dirs, and then Resolve moves one
// of them on (assignMACs). It depends on nothing else, so the same file
// gives the same MACs on every machine and run.
func DeriveMAC(vm string, index int) net.HardwareAddr { return deriveMAC(vm, index, 0) }

// deriveMAC is the try'th MAC an entry may be given: DeriveMAC's first,
// then a hash of the name, index and try (a try for each MAC already
// taken, in a fixed order: Resolve).
func deriveMAC(vm string, index, try int) net.HardwareAddr {
	in := "vmnetctl/" + vm + "/" + strconv.Itoa(index)
	if try > 0 {
		in += "/" + strconv.Itoa(try)
	}
	sum := sha256.Sum256([]byte(in))
	return net.HardwareAddr{0x52, sum[0], sum[1], sum[2], sum[3], sum[4]}
}

// LegacyMAC is the MAC vmnetctl derived for an entry before its MACs had
// 40 bits (v0.x, until December 2026): lima's prefix 52:55:55 and three
// bytes of the same hash. An attachment that runs with it keeps it until
// it goes (Resolve's keep), so an upgrade changes no running VM's MAC.
func LegacyMAC(vm string, index int) net.HardwareAddr {
	sum := sha256.Sum256([]byte("vmnetctl/" + vm + "/" + strconv.Itoa(index)))
	return net.HardwareAddr{0x52, 0x55, 0x55, sum[0], sum[1], sum[2]}
}

// maxMACTries bounds the MACs tried for one entry, and those recognised
// as an entry's own (derivedFor): the chance that 16 are all taken is
// nil for any number of VMs a host runs.
const maxMACTries = 16

// derivedFor reports whether mac is one vmnetctl derives, or derived, for
// a's entry: its legacy MAC or one of its tries.
func (a *Attachment) derivedFor(mac string) bool {
	// The first try first: almost every entry has it (each other try
	// costs a hash; Resolve asks this of every attachment that runs,
	// every pass).
	if first, legacy := a.derivedMACs(); mac == first || mac == legacy {
		return true
	}
	for try := 1; try < maxMACTries; try++ {
		if mac == deriveMAC(a.VM, a.Index, try).String() {
			return true
		}
	}
	return false
}

// parseMAC accepts a 48-bit unicast MAC address written with colons.
func parseMAC(s string) (net.HardwareAddr, string) {
	hw, err := net.ParseMAC(s)
	if err != nil || len(hw) != 6 || strings.Count(s, ":") != 5 {
		return nil, fmt.Sprintf("%q is not a MAC address like 52:55:55:12:34:56", s)
	}
	if hw[0]&1 == 1 {
		return nil, fmt.Sprintf("%q is a multicast address; a VM needs a unicast MAC", s)
	}
	if isZero(hw) {
		return nil, fmt.Sprintf("%q is the all-zero address", s)
	}
	return hw, ""
}

func isZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
