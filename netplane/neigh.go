package netplane

import "fmt"

// The host's neighbour table is the whole host's (the kernel's gc_thresh3,
// 1024 entries a family by default, for every interface): each next hop
// the host forwards a VM's packet to costs an entry, made before the next
// hop answers or not. A VM that sent to every address of its own subnet,
// of a LAN the host is on, or of an IPv6 /64 through its gateway would
// fill it, and the host could then reach nobody new. So the new
// connections a network's VMs open through the host may go to a bounded
// number of next hops (the routed next hop of a packet, its destination
// when on a link of the host's, the router otherwise: every destination
// behind the host's default route is one):
//
//	set nexthops4, nexthops6  next hops in use, at most neighMax each, for
//	                          neighTimeout after their first new connection
//	set nexthop-new           per VM port (its one MAC): a rate on the new
//	                          next hops it may add
//	counter neigh-limited     the connections refused for either bound
//
// A connection to a next hop already in the set costs nothing more; only
// new connections are checked (a flow's next hop was resolved when it
// began).
const (
	neighSet4    = "nexthops4"
	neighSet6    = "nexthops6"
	neighPerPort = "nexthop-new"
	NeighLimited = "neigh-limited"
	// neighPortRate is how fast one VM port may add next hops: a VM
	// reaching a few new hosts of a LAN, not one sweeping it.
	neighPortRate = "2/second burst 32 packets"
)

// neighRules are the forward chain's first rules for bridge br's new
// connections: a next hop not in use is added at the port's rate while
// the set has room, else the connection is refused and counted.
func neighRules(br string) []string {
	drop := fmt.Sprintf("counter name %q drop", NeighLimited)
	var rs []string
	for _, f := range []struct{ nfproto, proto, set string }{{"ipv4", "ip", neighSet4}, {"ipv6", "ip6", neighSet6}} {
		hop := "rt " + f.proto + " nexthop"
		isNew := "iifname " + br + " ct state new meta nfproto " + f.nfproto + " " + hop + " != @" + f.set + " "
		rs = append(rs,
			isNew+"add @"+neighPerPort+" { ether saddr limit rate over "+neighPortRate+" } "+drop,
			isNew+"add @"+f.set+" { "+hop+" }",
			isNew+drop)
	}
	return rs
}
