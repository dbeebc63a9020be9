package ctlapi

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestEventKindsListed: every kind of event the product's code writes
// (an Event's Kind, a network's OnLease kind) is one of EventKinds, which
// `events --kind` checks its argument against.
func TestEventKindsListed(t *testing.T) {
	kindRe := regexp.MustCompile(`(?:Kind: |[oO]nLease\()"([a-z-]+)"`)
	seen := map[string]bool{}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != ".." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "test" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range kindRe.FindAllStringSubmatch(string(b), -1) {
			seen[m[1]] = true
			if !slices.Contains(EventKinds, m[1]) {
				t.Errorf("%s writes events of kind %q, which EventKinds lacks", path, m[1])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) < 10 {
		t.Errorf("found only %d kinds in the code: %v", len(seen), seen)
	}
}
