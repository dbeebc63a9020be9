// Package dhcpserver is a network's DHCPv4 server: the decisions (which
// address a client gets, what it may decline or release, how fast it may
// ask) on the lease store, and the packet socket it answers on, to the
// client's Ethernet address alone.
package dhcpserver

// Stats count a DHCP server's traffic since it started.
type Stats struct {
	// Requests counts received messages by DHCP message type
	// ("DISCOVER", "REQUEST", "RELEASE", "DECLINE", "INFORM", "other").
	Requests map[string]uint64 `json:"requests"`
	// Replies counts sent messages by type ("OFFER", "ACK", "NAK").
	Replies map[string]uint64 `json:"replies"`
	// Errors counts messages dropped: unparsable, not for us, no address
	// left, or a reply that could not be sent.
	Errors uint64 `json:"errors"`
	// Spoofed counts messages dropped because their client address
	// (chaddr) was not the Ethernet address they came from.
	Spoofed uint64 `json:"spoofed"`
	// Limited counts messages dropped unanswered because their client
	// sent more than its rate allows (a few a second after a burst).
	Limited uint64 `json:"limited"`
}
