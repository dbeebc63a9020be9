package guard

import (
	"testing"
	"time"
)

// TestGenTrust: one clean read at a generation is not trusted (its
// elements may predate the commit the generation counts), nor a second
// that agrees but came within TrustGap of it; one TrustGap later that
// agrees is, until the generation or what is wanted changes, a write, or
// trustedSkips resyncs.
func TestGenTrust(t *testing.T) {
	var g genTrust
	if g.skip(0, 0) {
		t.Fatal("the zero value trusts")
	}
	at := time.Unix(1000, 0)
	next := func() time.Time { at = at.Add(TrustGap); return at }
	g.read(7, 42, true, at)
	if g.skip(7, 42) {
		t.Fatal("one read trusted")
	}
	g.read(7, 42, true, at.Add(TrustGap/2))
	if g.skip(7, 42) {
		t.Fatal("a second read within TrustGap of the first trusted")
	}
	g.read(7, 43, true, next()) // the elements changed under the same generation
	if g.skip(7, 43) {
		t.Fatal("two reads that differ trusted")
	}
	g.read(7, 43, true, next())
	if !g.skip(7, 43) {
		t.Fatal("two reads that agree, TrustGap apart, not trusted")
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
	g.read(7, 43, true, next())
	if !g.skip(7, 43) {
		t.Error("not trusted after the backstop's read found the same")
	}
	g.forget()
	if g.skip(7, 43) {
		t.Error("trusted after a write")
	}
	g.read(7, 43, true, next())
	g.read(7, 43, false, next())
	if g.skip(7, 43) {
		t.Error("trusted after a read that found the sets wrong")
	}
}
