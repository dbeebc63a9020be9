package hostnet

import "testing"

// TestMarks: a mark names its network and its state dir's owner; a
// process takes as its own (Ours) its owner's marks and those without an
// owner, and as mine only its owner's (or, without an owner, all).
func TestMarks(t *testing.T) {
	t.Cleanup(func() { SetOwner("") })
	SetOwner("/var/lib/a")
	a := Mark("shared")
	if id, ok := MarkedID(a); !ok || id != "shared" {
		t.Errorf("MarkedID(%q) = %q, %v", a, id, ok)
	}
	if MarkOwner(a) != OwnerTag("/var/lib/a") || len(MarkOwner(a)) != 8 {
		t.Errorf("MarkOwner(%q) = %q, want a's tag %q", a, MarkOwner(a), OwnerTag("/var/lib/a"))
	}
	SetOwner("/var/lib/b")
	b := Mark("shared")
	old := MarkPrefix + "shared" // from before owners were marked
	for _, c := range []struct {
		mark       string
		ours, mine bool
	}{{a, false, false}, {b, true, true}, {old, true, false}} {
		if Ours(c.mark) != c.ours || Mine(c.mark) != c.mine {
			t.Errorf("as b, %q: ours %v, mine %v; want %v, %v", c.mark, Ours(c.mark), Mine(c.mark), c.ours, c.mine)
		}
	}
	if _, ok := MarkedID("vmnetctl:tap=vmt-x"); ok {
		t.Error("a TAP's mark was taken for a network's")
	}
	SetOwner("")
	if !Ours(a) || !Mine(a) || Mark("x") != MarkPrefix+"x" {
		t.Errorf("without an owner: Ours %v, Mine %v, Mark %q", Ours(a), Mine(a), Mark("x"))
	}
}
