package ctlapi

import (
	"time"
)

// Event is one thing that happened, as `vmnetctl events` shows it; its
// Kind one of EventKinds.
type Event struct {
	Time    time.Time `json:"time"`
	Kind    string    `json:"kind"`
	Network string    `json:"network,omitempty"`
	// Attachment is VM/INDEX.
	Attachment string `json:"attachment,omitempty"`
	MAC        string `json:"mac,omitempty"`
	IP         string `json:"ip,omitempty"`
	PID        int    `json:"pid,omitempty"`
	Detail     string `json:"detail,omitempty"`
}

// EventKinds are the kinds of events the controller writes, in the order
// `events --help` lists them (TestEventKindsListed finds every kind the
// code writes here).
var EventKinds = []string{
	"network-up", "network-removed", "drift-found", "drift-repaired", "reloaded", "reload-failed",
	"helper-started", "helper-exited", "helper-failed",
	"lease-granted", "lease-released", "lease-declined", "lease-expired", "leases-rebuilt", "address-learned",
	"egress-denied",
}
