package guard

import (
	"slices"
	"testing"
)

// TestFullClaims: recounted from every port's state, the claimed MACs are
// what the ports hold and the expected MACs; a port that holds another
// port's expected MAC is evicted (its MAC stays claimed, for its owner);
// expected follows what is wanted; a MAC nobody holds or expects is no
// longer claimed.
func TestFullClaims(t *testing.T) {
	const a, b, stray, stale = "52:54:00:00:00:0a", "52:54:00:00:00:0b", "52:54:00:00:00:99", "52:54:00:00:00:77"
	st := &State{
		Learned:      map[string]string{"p-a": a, "p-x": b, "p-s": stray}, // p-x holds b, which p-b expects
		index:        map[string]uint32{"p-a": 1, "p-x": 2, "p-s": 3},
		Claimed:      map[string]bool{a: true, stale: true},
		ExpectedMACs: map[string]bool{a: true, stale: true},
	}
	owner := map[string]string{a: "p-a", b: "p-b"}
	ch := fullClaims(st, owner, map[string]bool{a: true, b: true})
	if len(ch.evict) != 1 || ch.evict[0].index != 2 || ch.evict[0].held != b || !ch.evict[0].keepClaim {
		t.Errorf("evicted %+v, want p-x (index 2) losing %s, kept claimed", ch.evict, b)
	}
	slices.Sort(ch.addClaimed)
	if want := []string{b, stray}; !slices.Equal(ch.addClaimed, want) {
		t.Errorf("claimed added %v, want %v", ch.addClaimed, want)
	}
	if !slices.Equal(ch.delClaimed, []string{stale}) || !slices.Equal(ch.delExpected, []string{stale}) || !slices.Equal(ch.addExpected, []string{b}) {
		t.Errorf("claimed deleted %v, expected added %v and deleted %v; want [%s], [%s], [%s]", ch.delClaimed, ch.addExpected, ch.delExpected, stale, b, stale)
	}
}
