package doctor

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/overlay"
)

// checkEVPN: a network across hosts with EVPN needs FRR running here (its
// vtysh answering, in a network namespace the namespace's own instance),
// and its BGP sessions with the other hosts up: without them, FRR
// installs no forwarding entry and the VMs of the hosts do not meet.
func checkEVPN(ctx context.Context, nets []*api.Network) []Finding {
	var out []Finding
	for _, n := range nets {
		if n.VXLAN == nil || n.VXLAN.EVPN == nil {
			continue
		}
		self, _, err := overlay.VXLANHost(n)
		if err != nil {
			continue // not one of the segment's hosts: checkVXLAN says so
		}
		name := "EVPN of " + n.ID
		sessions, err := overlay.EVPNSessions(ctx, n)
		if err != nil {
			// The network runs without it (degraded): a warning, as status has it.
			out = append(out, Finding{Check: name, Status: Warn, Detail: err.Error(),
				Fix: "install FRR (apt-get install frr), turn bgpd on in /etc/frr/daemons (bgpd=yes) and start it (systemctl restart frr); in a network namespace NS, start FRR's instance of it (/usr/lib/frr/frrinit.sh start NS)"})
			continue
		}
		var down []string
		for i, h := range n.VXLAN.Hosts {
			if i == self {
				continue
			}
			switch s, ok := sessions[h.Address.String()]; {
			case !ok:
				down = append(down, fmt.Sprintf("%s (%s): no session (is the network up here?)", h.Name, h.Address))
			case s != "Established":
				down = append(down, fmt.Sprintf("%s (%s): %s", h.Name, h.Address, s))
			}
		}
		others := len(n.VXLAN.Hosts) - 1
		if len(down) == 0 {
			out = append(out, Finding{Check: name, Status: OK, Detail: fmt.Sprintf("%d of %d BGP sessions established (AS %d)", others, others, n.VXLAN.EVPN.ASN)})
			continue
		}
		slices.Sort(down)
		out = append(out, Finding{Check: name, Status: Warn,
			Detail: fmt.Sprintf("%d of %d BGP sessions established; not with %s", others-len(down), others, strings.Join(down, "; ")),
			Fix:    "bring the network up on those hosts, with FRR running there, and let TCP port 179 through between the hosts' underlay addresses (vtysh -c 'show bgp l2vpn evpn summary' tells more)"})
	}
	return out
}
