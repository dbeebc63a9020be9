package guard

import (
	"fmt"
	"hash/fnv"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
)

// The learner's part of the guard (netplane's learner reads what it
// copies): each network's NFLOG group, and the rule that copies an ARP
// from an unbound sender address to it.
const (
	arpLearnRate   = "10/second burst 20 packets"
	learnGroupBase = 0x5600
	learnGroupSpan = 0xa9ff
)

// LearnGroup is network id's NFLOG group: one of a range vmnetctl takes.
// The kernel lets one socket bind a group: a network whose group another
// holds (a hash that collides, someone else's NFLOG user) runs without
// learning, and says so.
func LearnGroup(id string) uint16 {
	h := fnv.New32a()
	h.Write([]byte(id))
	return uint16(learnGroupBase + h.Sum32()%learnGroupSpan)
}

// LearnRule is the guard's rule that copies an ARP from an unbound sender
// address to the learner (before the rule that drops it).
func LearnRule(n *api.Network) string {
	return "arp saddr ip != 0.0.0.0 ether saddr . arp saddr ip != @" + SetAddrs + " " +
		Meter(SetLearn4Rate, "limit rate "+arpLearnRate) + fmt.Sprintf(" log group %d", LearnGroup(n.ID))
}

// Resync is how often the guard's addresses are compared with the
// leases: a lease that expired stops being a valid source at most this
// long after.
const Resync = 15 * time.Second
