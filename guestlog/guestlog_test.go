package guestlog

import (
	"fmt"
	"testing"
	"time"
)

// TestByClient: at most Total lines per Every from every key together,
// the next line that passes says how many were held back, and one key
// gets one line per Every.
func TestByClient(t *testing.T) {
	g := &ByClient{Total: 2}
	now := time.Unix(1_800_000_000, 0)
	for i := range 10 {
		if ok, _ := g.Allow(fmt.Sprint(i), now); ok != (i < 2) {
			t.Fatalf("line %d: allowed %v", i, ok)
		}
	}
	if ok, held := g.Allow("late", now.Add(Every)); !ok || held != 8 {
		t.Fatalf("after the window: allowed %v, %d held back; want true, 8", ok, held)
	}
	if ok, _ := g.Allow("late", now.Add(Every+time.Second)); ok {
		t.Fatal("one key logged twice within Every")
	}
}

// TestLimit: one line per Every, the next saying how many were held.
func TestLimit(t *testing.T) {
	var l Limit
	now := time.Unix(1_800_000_000, 0)
	if ok, _ := l.Allow(now); !ok {
		t.Fatal("the first line was held back")
	}
	for range 3 {
		if ok, _ := l.Allow(now.Add(time.Second)); ok {
			t.Fatal("a second line passed within Every")
		}
	}
	if ok, held := l.Allow(now.Add(Every)); !ok || held != 3 {
		t.Fatalf("after Every: %v, %d held; want true, 3", ok, held)
	}
}
