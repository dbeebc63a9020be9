package doctor

import (
	"strings"
	"testing"
)

// TestRenderCountsProblems: the report counts its problems in words: "1
// problem found.", "2 problems found.", not "1 problem(s)".
func TestRenderCountsProblems(t *testing.T) {
	for n, want := range map[int]string{0: "No problems found.", 1: "1 problem found.", 2: "2 problems found."} {
		var b strings.Builder
		if err := (&Report{Problems: n}).Render(&b); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(b.String(), want) {
			t.Errorf("%d problems: %q, want %q", n, b.String(), want)
		}
	}
}
