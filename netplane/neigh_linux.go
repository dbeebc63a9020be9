package netplane

import (
	"context"
	"time"

	"sigs.k8s.io/knftables"
)

const (
	// neighMax bounds a network's next hops in each family: a quarter of
	// the kernel's default hard limit, so that four networks full of
	// hostile VMs still leave the host room.
	neighMax = 256
)

// neighTimeout is how long a next hop stays in the set after it was
// added: the kernel's gc_stale_time, after which an unused entry may go.
const neighTimeout = 60 * time.Second

// addNeighObjects adds to tx the sets and the counter of the neighbour
// bound.
func addNeighObjects(tx *knftables.Transaction) {
	timed := []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag}
	size := knftables.PtrTo(uint64(neighMax))
	tx.Add(&knftables.Set{Name: neighSet4, Type: "ipv4_addr", Size: size, Flags: timed, Timeout: knftables.PtrTo(neighTimeout)})
	tx.Add(&knftables.Set{Name: neighSet6, Type: "ipv6_addr", Size: size, Flags: timed, Timeout: knftables.PtrTo(neighTimeout)})
	tx.Add(&knftables.Set{Name: neighPerPort, Type: "ether_addr", Size: knftables.PtrTo(uint64(65535)), Flags: timed, Timeout: knftables.PtrTo(neighTimeout)})
	tx.Add(&knftables.Counter{Name: NeighLimited})
}

// neighLimited is how many connections network id's neighbour bound
// refused.
func neighLimited(ctx context.Context, id string) uint64 {
	c, _ := namedCounters(ctx, knftables.InetFamily, id, NeighLimited)
	return c[NeighLimited]
}
