package backend

import (
	"errors"
	"fmt"
	"testing"
)

// TestOnlyFRR: CheckNetwork's error is FRR's alone only if every error it
// joins is an FRRError; FRRUnreachable finds one of FRR not answering.
func TestOnlyFRR(t *testing.T) {
	drift := &FRRError{Err: errors.New("FRR has no router bgp 65000")}
	down := &FRRError{Err: errors.New("bgpd is not running"), Unreachable: true}
	other := errors.New("the bridge is down")
	for _, tc := range []struct {
		err               error
		only, unreachable bool
	}{
		{nil, false, false},
		{drift, true, false},
		{errors.Join(drift, down), true, true},
		{errors.Join(drift, other), false, false},
		{errors.Join(other, down), false, true},
		{fmt.Errorf("wrapped: %w", drift), false, false},
		{other, false, false},
	} {
		if got := OnlyFRR(tc.err); got != tc.only {
			t.Errorf("OnlyFRR(%v) = %v, want %v", tc.err, got, tc.only)
		}
		if got := FRRUnreachable(tc.err); got != tc.unreachable {
			t.Errorf("FRRUnreachable(%v) = %v, want %v", tc.err, got, tc.unreachable)
		}
	}
}
