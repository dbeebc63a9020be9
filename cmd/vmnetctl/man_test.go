package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// With SOURCE_DATE_EPOCH the man pages carry its date, not today's, so
// two builds of the packages write the same bytes.
func TestManPagesSourceDateEpoch(t *testing.T) {
	t.Setenv("SOURCE_DATE_EPOCH", "1700000000") // 2023-11-14
	dir := t.TempDir()
	if code, _, errOut := runCLI(t, "man", dir); code != 0 {
		t.Fatalf("vmnetctl man: exit %d: %s", code, errOut)
	}
	b, err := os.ReadFile(filepath.Join(dir, "vmnetctl-doctor.8"))
	if err != nil {
		t.Fatal(err)
	}
	if th, _, _ := strings.Cut(string(b), "\n"); !strings.Contains(th, `"November 2023"`) {
		t.Errorf("the page's date: %s, want November 2023 (SOURCE_DATE_EPOCH)", th)
	}
}
