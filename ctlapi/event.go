package ctlapi

import (
	"time"
)

// Event is one thing that happened, as `vmnetctl events` shows it. Kinds:
// network-up, network-removed, drift-found, drift-repaired,
// helper-started, helper-exited, helper-failed, lease-granted,
// lease-released, lease-declined, lease-expired.
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
