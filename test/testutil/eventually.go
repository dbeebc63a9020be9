package testutil

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// Condition is what Eventually waits on: a func() error that returns nil
// once the condition holds (its error says why not, for the failure
// message), or a func() bool.
type Condition interface {
	func() error | func() bool
}

// Eventually calls cond until it holds, and fails the test if it does not
// within timeout. msgf, if given, is a format and its arguments saying what
// is awaited. It polls (every 10 ms at first, backing off to 100 ms): a
// deadline on a condition, never a sleep as synchronisation. A cond that
// returns Permanent(err) fails the test at once. Call it from the test's
// goroutine.
func Eventually[C Condition](tb testing.TB, timeout time.Duration, cond C, msgf ...any) {
	tb.Helper()
	var f func() error
	switch c := any(cond).(type) {
	case func() error:
		f = c
	case func() bool:
		f = func() error {
			if !c() {
				return errors.New("the condition is false")
			}
			return nil
		}
	}
	if err := Poll(timeout, f); err != nil {
		tb.Fatalf("%s: %v", what(msgf), err)
	}
}

// Poll is Eventually without a test: it calls cond until it returns nil
// and returns nil, or returns the last error once timeout has passed (or at
// once for Permanent(err)). For use where there is no testing.TB, or where
// the caller decides what a timeout means.
func Poll(timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	interval := 10 * time.Millisecond
	for {
		err := cond()
		if err == nil {
			return nil
		}
		var p *permanent
		if errors.As(err, &p) {
			return p.err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("still not true after %v: %w", timeout, err)
		}
		time.Sleep(interval) // the poll interval, not synchronisation
		interval = min(2*interval, 100*time.Millisecond)
	}
}

// Permanent wraps an error that no amount of waiting will fix (the process
// being waited for exited): Eventually and Poll stop at once.
func Permanent(err error) error { return &permanent{err} }

type permanent struct{ err error }

func (p *permanent) Error() string { return p.err.Error() }
func (p *permanent) Unwrap() error { return p.err }

func what(msgf []any) string {
	if len(msgf) == 0 {
		return "waiting"
	}
	if f, ok := msgf[0].(string); ok {
		return "waiting for " + fmt.Sprintf(f, msgf[1:]...)
	}
	return "waiting for " + fmt.Sprint(msgf...)
}
