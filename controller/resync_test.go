package controller

import (
	"testing"
	"time"
)

// TestResyncAfter: the resync comes every period, and no sooner than
// resyncShare full passes' time after the last: a pass of 4.6 s (10,000
// VMs here) is followed by 92 s of rest, not 30.
func TestResyncAfter(t *testing.T) {
	for _, c := range []struct{ period, pass, want time.Duration }{
		{30 * time.Second, 50 * time.Millisecond, 30 * time.Second},
		{30 * time.Second, 1500 * time.Millisecond, 30 * time.Second},
		{30 * time.Second, 4600 * time.Millisecond, 92 * time.Second},
		{time.Hour, 4600 * time.Millisecond, time.Hour},
	} {
		if got := resyncAfter(c.period, c.pass); got != c.want {
			t.Errorf("resyncAfter(%v, %v) = %v, want %v", c.period, c.pass, got, c.want)
		}
	}
}
