package api

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
)

// OnDemandSource is the Source.File of a network made on demand.
const OnDemandSource = "(on demand)"

// OnDemandNetwork is the network vmnet makes on demand for vmnet-helper's
// address flags: mode shared or host, the gateway at start, DHCP from
// start+1 to end, the subnet of start and mask. Its id is "od-" and 8 hex
// digits of a hash of the four, so the same flags give the same network.
// def is its definition as networks.yaml text (what a project records).
func OnDemandNetwork(mode Mode, start, end, mask netip.Addr) (n *Network, def []byte, err error) {
	if mode != ModeShared && mode != ModeHost {
		return nil, nil, fmt.Errorf("networks made on demand are shared or host, not %s", mode)
	}
	ones, bits := net.IPMask(mask.AsSlice()).Size()
	if bits != 32 {
		return nil, nil, fmt.Errorf("--subnet-mask %s is not a netmask", mask)
	}
	sum := sha256.Sum256([]byte(fmt.Sprintf("%s|%s|%s|%s", mode, start, end, mask)))
	id := "od-" + hex.EncodeToString(sum[:4])
	def = []byte(fmt.Sprintf("vmnet:\n  %s:\n    mode: %s\n    subnet: %s/%d\n    dhcpRange: {start: %s, end: %s}\n",
		id, mode, start, ones, start.Next(), end))
	nets, diags := LoadNetworks(OnDemandSource, def)
	if err := diags.Err(); err != nil {
		return nil, nil, fmt.Errorf("--start-address %s --end-address %s --subnet-mask %s: %w", start, end, mask, err)
	}
	n = nets.Get(id)
	n.OnDemand = def
	return n, def, nil
}
