package guard

import "testing"

// TestGenTrust: one clean read at a generation is not trusted (its
// elements may predate the commit the generation counts); a second at the
// same generation that found the same is, until the generation or what
// is wanted changes, a write, or trustedSkips resyncs.
func TestGenTrust(t *testing.T) {
	var g genTrust
	if g.skip(0, 0) {
		t.Fatal("the zero value trusts")
	}
	g.read(7, 42, true)
	if g.skip(7, 42) {
		t.Fatal("one read trusted")
	}
	g.read(7, 43, true) // the elements changed under the same generation
	if g.skip(7, 43) {
		t.Fatal("two reads that differ trusted")
	}
	g.read(7, 43, true)
	if !g.skip(7, 43) {
		t.Fatal("two reads that agree not trusted")
	}
	for _, c := range []struct {
		gen    uint32
		digest uint64
	}{{8, 43}, {7, 44}} {
		if g.skip(c.gen, c.digest) {
			t.Errorf("trusted at generation %d, digest %d", c.gen, c.digest)
		}
	}
	n := 1
	for g.skip(7, 43) {
		n++
	}
	if n != trustedSkips {
		t.Errorf("%d resyncs skipped in a row, want %d", n, trustedSkips)
	}
	g.read(7, 43, true)
	if !g.skip(7, 43) {
		t.Error("not trusted after the backstop's read found the same")
	}
	g.forget()
	if g.skip(7, 43) {
		t.Error("trusted after a write")
	}
	g.read(7, 43, true)
	g.read(7, 43, false)
	if g.skip(7, 43) {
		t.Error("trusted after a read that found the sets wrong")
	}
}
