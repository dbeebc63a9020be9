package backend

import (
	"context"

	"github.com/vmnetctl/vmnetctl/api"
)

// FRRError is what CheckNetwork finds wrong in the FRR part of a segment
// with EVPN (api.EVPN): FRR lost the configuration vmnetctl gave it (it
// restarted), or does not answer (not running, bgpd off, hung). That part
// is repaired on its own (FRREnsurer), and the network, whose services the
// local VMs need whatever FRR does, runs meanwhile (degraded).
type FRRError struct {
	Err error
	// Unreachable: FRR does not answer, and so cannot be repaired now.
	Unreachable bool
}

func (e *FRRError) Error() string { return e.Err.Error() }
func (e *FRRError) Unwrap() error { return e.Err }

// OnlyFRR says whether err (CheckNetwork's, which may join several) is
// made of FRRErrors alone.
func OnlyFRR(err error) bool {
	if err == nil {
		return false
	}
	if _, ok := err.(*FRRError); ok {
		return true
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			if !OnlyFRR(e) {
				return false
			}
		}
		return len(j.Unwrap()) > 0
	}
	return false
}

// FRRUnreachable says whether err holds an FRRError of FRR not answering.
func FRRUnreachable(err error) bool {
	if fe, ok := err.(*FRRError); ok {
		return fe.Unreachable
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			if FRRUnreachable(e) {
				return true
			}
		}
	}
	return false
}

// FRREnsurer is a backend that gives FRR a network's EVPN configuration
// again, without touching the rest of the network.
type FRREnsurer interface {
	EnsureFRR(ctx context.Context, n *api.Network, o NetworkOptions) error
}
