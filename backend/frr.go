package backend

import (
	"context"

	"github.com/vmnetctl/vmnetctl/api"
)

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
