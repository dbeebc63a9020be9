package ops

import (
	"testing"
	"time"
)

func TestHandshakeAge(t *testing.T) {
	now := time.Date(2026, 11, 24, 5, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		at   time.Time
		want string
	}{
		{time.Time{}, "no handshake yet"},
		{now.Add(-42 * time.Second), "handshake 42s ago"},
		{now.Add(-4 * time.Minute), "DOWN, last handshake 4m0s ago"},
	} {
		if got := handshakeAge(tt.at, now); got != tt.want {
			t.Errorf("handshakeAge(%v) = %q, want %q", tt.at, got, tt.want)
		}
	}
}
