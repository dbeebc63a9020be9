package controller

import (
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	b := Backoff{First: 100 * time.Millisecond, Max: time.Second, Healthy: time.Minute}
	var got []time.Duration
	for range 6 {
		got = append(got, b.Next(time.Second))
	}
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("delays = %v, want %v ms", got, want)
		}
	}
	if d := b.Next(2 * time.Minute); d != 100*time.Millisecond {
		t.Errorf("after a healthy run the delay is %v, want the first delay again", d)
	}
}
