package helperproto

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
)

// Ready is the JSON line a helper prints on stdout once the VM's interface is
// up. vmnet-helper and `vmnetctl helper` print the same keys; the vmnet_*
// keys are vmnet-helper's, net_* come with --network, tap_name is vmnetctl's.
// Zero values mean the key was absent.
type Ready struct {
	// MACAddress is the address the VM should use (vmnet_mac_address).
	MACAddress net.HardwareAddr
	// MTU is the network's MTU (vmnet_mtu).
	MTU int
	// MaxPacketSize is the largest datagram the helper sends or accepts,
	// without a virtio-net header: MTU+14, or 65550 with TSO
	// (vmnet_max_packet_size).
	MaxPacketSize int
	// InterfaceID is the id the MAC address derives from (vmnet_interface_id).
	InterfaceID string
	// StartAddress is the gateway, EndAddress the end of the DHCP range,
	// SubnetMask the network's mask (vmnet_start_address, ...).
	StartAddress netip.Addr
	EndAddress   netip.Addr
	SubnetMask   netip.Addr
	// NAT66Prefix is vmnet's IPv6 prefix in shared mode (vmnet_nat66_prefix).
	NAT66Prefix string
	// ReadMaxPackets and WriteMaxPackets are vmnet's batch sizes.
	ReadMaxPackets  int
	WriteMaxPackets int
	// IPv4Subnet and IPv4Mask describe the network joined with --network
	// (net_ipv4_subnet, net_ipv4_mask); IPv6Prefix and IPv6PrefixLen likewise.
	IPv4Subnet    netip.Addr
	IPv4Mask      netip.Addr
	IPv6Prefix    string
	IPv6PrefixLen int
	// TapName is the Linux TAP of the VM (tap_name; vmnetctl only), and
	// TapIndex its interface index (tap_index): the controller's pass
	// looks at the guard of that port alone once the helper went.
	TapName  string
	TapIndex int
}

// The wire keys, in one place.
const (
	keyMAC             = "vmnet_mac_address"
	keyMTU             = "vmnet_mtu"
	keyMaxPacketSize   = "vmnet_max_packet_size"
	keyInterfaceID     = "vmnet_interface_id"
	keyStartAddress    = "vmnet_start_address"
	keyEndAddress      = "vmnet_end_address"
	keySubnetMask      = "vmnet_subnet_mask"
	keyNAT66Prefix     = "vmnet_nat66_prefix"
	keyReadMaxPackets  = "vmnet_read_max_packets"
	keyWriteMaxPackets = "vmnet_write_max_packets"
	keyIPv4Subnet      = "net_ipv4_subnet"
	keyIPv4Mask        = "net_ipv4_mask"
	keyIPv6Prefix      = "net_ipv6_prefix"
	keyIPv6PrefixLen   = "net_ipv6_prefix_len"
	keyTapName         = "tap_name"
	keyTapIndex        = "tap_index"
)

// ParseReady parses a helper's JSON line. Keys are read by name (their order
// is not defined) and unknown keys are ignored, so newer helpers stay
// readable; vmnet_mac_address and vmnet_max_packet_size are required.
func ParseReady(line []byte) (Ready, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(line, &raw); err != nil {
		return Ready{}, fmt.Errorf("helper's ready line is not a JSON object: %w", err)
	}
	if raw == nil {
		return Ready{}, errors.New("helper's ready line is not a JSON object: null")
	}
	var r Ready
	var errs []error
	str := func(key string, dst *string) {
		v, ok := raw[key]
		if !ok {
			return
		}
		if err := json.Unmarshal(v, dst); err != nil {
			errs = append(errs, fmt.Errorf("%s: want a string, got %s", key, v))
		}
	}
	num := func(key string, dst *int) {
		v, ok := raw[key]
		if !ok {
			return
		}
		if err := json.Unmarshal(v, dst); err != nil || *dst < 0 {
			*dst = 0
			errs = append(errs, fmt.Errorf("%s: want a non-negative integer, got %s", key, v))
		}
	}
	addr := func(key string, dst *netip.Addr) {
		var s string
		str(key, &s)
		if s == "" {
			return
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", key, err))
			return
		}
		*dst = a
	}

	var mac string
	str(keyMAC, &mac)
	switch hw, err := net.ParseMAC(mac); {
	case mac == "":
		errs = append(errs, fmt.Errorf("%s is missing", keyMAC))
	case err != nil || len(hw) != 6:
		errs = append(errs, fmt.Errorf("%s: %q is not a 48-bit MAC address", keyMAC, mac))
	default:
		r.MACAddress = hw
	}
	num(keyMTU, &r.MTU)
	num(keyMaxPacketSize, &r.MaxPacketSize)
	if _, ok := raw[keyMaxPacketSize]; !ok {
		errs = append(errs, fmt.Errorf("%s is missing", keyMaxPacketSize))
	} else if r.MaxPacketSize == 0 {
		errs = append(errs, fmt.Errorf("%s must be positive", keyMaxPacketSize))
	}
	str(keyInterfaceID, &r.InterfaceID)
	addr(keyStartAddress, &r.StartAddress)
	addr(keyEndAddress, &r.EndAddress)
	addr(keySubnetMask, &r.SubnetMask)
	str(keyNAT66Prefix, &r.NAT66Prefix)
	num(keyReadMaxPackets, &r.ReadMaxPackets)
	num(keyWriteMaxPackets, &r.WriteMaxPackets)
	addr(keyIPv4Subnet, &r.IPv4Subnet)
	addr(keyIPv4Mask, &r.IPv4Mask)
	str(keyIPv6Prefix, &r.IPv6Prefix)
	num(keyIPv6PrefixLen, &r.IPv6PrefixLen)
	str(keyTapName, &r.TapName)
	num(keyTapIndex, &r.TapIndex)
	if err := errors.Join(errs...); err != nil {
		return Ready{}, fmt.Errorf("invalid helper ready line: %w", err)
	}
	return r, nil
}

// MarshalJSON writes the line as helpers print it; absent (zero) values are
// left out.
func (r Ready) MarshalJSON() ([]byte, error) {
	m := map[string]any{}
	putStr := func(key, v string) {
		if v != "" {
			m[key] = v
		}
	}
	putNum := func(key string, v int) {
		if v != 0 {
			m[key] = v
		}
	}
	putAddr := func(key string, a netip.Addr) {
		if a.IsValid() {
			m[key] = a.String()
		}
	}
	if r.MACAddress != nil {
		m[keyMAC] = r.MACAddress.String()
	}
	putNum(keyMTU, r.MTU)
	putNum(keyMaxPacketSize, r.MaxPacketSize)
	putStr(keyInterfaceID, r.InterfaceID)
	putAddr(keyStartAddress, r.StartAddress)
	putAddr(keyEndAddress, r.EndAddress)
	putAddr(keySubnetMask, r.SubnetMask)
	putStr(keyNAT66Prefix, r.NAT66Prefix)
	putNum(keyReadMaxPackets, r.ReadMaxPackets)
	putNum(keyWriteMaxPackets, r.WriteMaxPackets)
	putAddr(keyIPv4Subnet, r.IPv4Subnet)
	putAddr(keyIPv4Mask, r.IPv4Mask)
	putStr(keyIPv6Prefix, r.IPv6Prefix)
	putNum(keyIPv6PrefixLen, r.IPv6PrefixLen)
	putStr(keyTapName, r.TapName)
	putNum(keyTapIndex, r.TapIndex)
	return json.Marshal(m)
}

// SudoID is $SUDO_UID or $SUDO_GID (name), or -1 when it is not an id. By
// vmnet-helper's contract these name the user a privileged helper drops to
// and acts for; vmnetctl reads them for the owner of a project, a helper's
// default --uid and --gid, and a VMM run by `vmnetctl run`.
func SudoID(name string) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v >= 0 {
		return v
	}
	return -1
}
