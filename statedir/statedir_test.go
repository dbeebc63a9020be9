package statedir

import (
	"errors"
	"os"
	"testing"
)

func TestLockIsExclusive(t *testing.T) {
	s := Dir{Path: t.TempDir()}
	l, err := s.TryLockController()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.TryLockController(); !errors.Is(err, ErrLocked) {
		t.Fatalf("second TryLock: %v, want ErrLocked", err)
	}
	if err := l.Unlock(); err != nil {
		t.Fatal(err)
	}
	l2, err := s.TryLockController()
	if err != nil {
		t.Fatalf("TryLock after Unlock: %v", err)
	}
	l2.Unlock()
}

func TestWriteJSONIsAtomicAndReadable(t *testing.T) {
	s := Dir{Path: t.TempDir()}
	type doc struct{ A int }
	if found, err := s.readJSON("projects/p.json", &doc{}); found || err != nil {
		t.Fatalf("missing file: found=%v err=%v", found, err)
	}
	for i := 1; i <= 3; i++ {
		if err := s.writeJSON("projects/p.json", doc{A: i}); err != nil {
			t.Fatal(err)
		}
	}
	var got doc
	if found, err := s.readJSON("projects/p.json", &got); !found || err != nil || got.A != 3 {
		t.Fatalf("read %+v found=%v err=%v", got, found, err)
	}
	entries, _ := os.ReadDir(s.file("projects"))
	if len(entries) != 1 {
		t.Errorf("temporary files left behind: %v", entries)
	}
}
