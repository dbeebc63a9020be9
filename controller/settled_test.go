package controller

import (
	"context"
	"slices"
	"testing"

	"github.com/vmnetctl/vmnetctl/backend"
	"github.com/vmnetctl/vmnetctl/spec"
)

// TestSettled: a full pass leaves the ports unread only while the watch's
// count stands since a full pass that read them began and ended clean,
// with the same ports, nine passes in a row at most; never without a
// watch, or with one that cannot tell.
func TestSettled(t *testing.T) {
	var n uint64
	ok := true
	s := settled{notices: func() (uint64, bool) { return n, ok }}
	// pass runs a full pass over ports (their digest), clean or not, and
	// tells whether it left them unread.
	pass := func(ports uint64, clean bool) bool {
		p := s.begin(ports)
		s.end(p, clean)
		return p.quiet
	}
	steps := []struct {
		what  string
		do    func()
		ports uint64
		clean bool
		quiet bool
	}{
		{"the first pass", nil, 1, true, false},
		{"nothing said since", nil, 1, true, true},
		{"a notice", func() { n++ }, 1, true, false},
		{"nothing said since the pass that read them", nil, 1, false, true},
		{"another helper's port", nil, 2, false, false},
		{"after a pass that failed", nil, 2, true, false},
		{"after one that did not", nil, 2, true, true},
		{"a watch that cannot tell", func() { ok = false }, 2, true, false},
		{"a watch that can again", func() { ok = true }, 2, true, false},
		{"and nothing said since", nil, 2, true, true},
		{"a settled pass that failed", nil, 2, false, true},
		{"after it", nil, 2, true, false},
		{"and nothing said since", nil, 2, true, true},
	}
	for _, st := range steps {
		if st.do != nil {
			st.do()
		}
		if got := pass(st.ports, st.clean); got != st.quiet {
			t.Fatalf("%s: left the ports unread: %v, want %v", st.what, got, st.quiet)
		}
	}
	// The mark is the count as a pass that reads begins: a notice during
	// it (its own writes, or a change after it read) and the next reads.
	p := s.begin(3) // (another helper's port: it reads)
	n++
	s.end(p, true)
	if p.quiet || pass(3, true) {
		t.Fatal("a notice during a pass that read the ports: the next left them unread")
	}
	if !pass(3, true) {
		t.Fatal("after a pass that read them and nothing said since, the next read them")
	}
	// The backstop: nine in a row, then a pass that reads them.
	for i := 2; i <= settledSkips; i++ {
		if !pass(3, true) {
			t.Fatalf("settled pass %d read the ports", i)
		}
	}
	if pass(3, true) {
		t.Fatalf("pass %d in a row left the ports unread", settledSkips+1)
	}
	if !pass(3, true) {
		t.Error("after the backstop's read, the next pass read them too")
	}
	if s.read != 10 || s.unread != 16 {
		t.Errorf("passes read, settled: %d, %d, want 10, 16", s.read, s.unread)
	}
	none := settled{}
	if p := none.begin(1); p.quiet {
		t.Error("a pass without a watch left the ports unread")
	}
}

// TestSettledScope: a full pass whose ports settled checks the ports and
// reads the claims again only of the networks it started or repaired or
// whose attachments changed, as a pass asked for does, where a full pass
// reads every network's. (It still checks every network: TestCheckScope.)
func TestSettledScope(t *testing.T) {
	c, desired := runningPorts("a", "b")
	nets := desired.Networks
	nothing := &spec.Plan{}
	for _, tc := range []struct {
		name    string
		settled bool
		ports   []string // whose ports are checked
		reread  []string // whose claims are read again
	}{
		{"full", false, []string{"a", "b"}, []string{"a", "b"}},
		{"settled", true, nil, nil},
	} {
		scope := newPortScope(nothing, true)
		if tc.settled {
			scope.settle()
		}
		pb := &portsBackend{}
		c.be = pb
		if errs := c.ensurePorts(context.Background(), desired, scope); len(errs) > 0 {
			t.Fatal(errs)
		}
		if !slices.Equal(pb.checked, tc.ports) {
			t.Errorf("%s: ports checked on %v, want %v", tc.name, pb.checked, tc.ports)
		}
		cb := &claimsBackend{opts: map[string]backend.ClaimOptions{}, atts: map[string][]string{}}
		c.be, c.claimed = cb, nil
		if errs := c.claimPorts(context.Background(), desired, nothing, scope); len(errs) > 0 {
			t.Fatal(errs)
		}
		var reread []string
		for _, n := range nets {
			if cb.opts[n.ID].Reread {
				reread = append(reread, n.ID)
			}
		}
		if !slices.Equal(reread, tc.reread) {
			t.Errorf("%s: claims read again on %v, want %v", tc.name, reread, tc.reread)
		}
		if !tc.settled {
			continue
		}
		// b repaired in the pass: its ports are checked, its claims read.
		scope.add("b")
		pb.checked = nil
		c.be = pb
		c.ensurePorts(context.Background(), desired, scope)
		if !slices.Equal(pb.checked, []string{"b"}) {
			t.Errorf("settled, b repaired: ports checked on %v, want [b]", pb.checked)
		}
		clear(cb.opts)
		c.be = cb
		c.claimPorts(context.Background(), desired, nothing, scope)
		if !cb.opts["b"].Reread || cb.opts["a"].Reread {
			t.Errorf("settled, b repaired: claims told %v, want b's read again, not a's", cb.opts)
		}
	}
}
