package controller

import "time"

// Backoff decides how long to wait before restarting a helper that exited.
// The first retry is fast (a VM's cable should be back well under a second),
// later ones double up to Max, and a helper that stayed up for Healthy starts
// from the beginning again, so one crash a day never waits long.
type Backoff struct {
	First   time.Duration
	Max     time.Duration
	Healthy time.Duration

	failures int
}

// DefaultBackoff is the helpers' restart policy.
func DefaultBackoff() Backoff {
	return Backoff{First: 100 * time.Millisecond, Max: 30 * time.Second, Healthy: time.Minute}
}

// Next returns the delay before the next start of a helper that ran for
// uptime before it exited.
func (b *Backoff) Next(uptime time.Duration) time.Duration {
	if uptime >= b.Healthy {
		b.failures = 0
	}
	d := b.First
	for i := 0; i < b.failures && d < b.Max; i++ {
		d *= 2
	}
	b.failures++
	return min(d, b.Max)
}

// Reset forgets past failures.
func (b *Backoff) Reset() { b.failures = 0 }
