package relay

import (
	"fmt"
	"strings"
	"testing"
)

// TestSpecVersion: a spec reads back as written; one of another version
// (a vmnetctl and a vmnetctl-relay of different builds) is refused.
func TestSpecVersion(t *testing.T) {
	s := Spec{TAP: 5, Socket: 6, Frame: 1514, TapName: "vmt-x", Relearn: []string{"/usr/bin/vmnetctl", "helper"}}
	v, err := s.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeSpec(v)
	if err != nil || got.TapName != "vmt-x" || got.Frame != 1514 || len(got.Relearn) != 2 {
		t.Errorf("DecodeSpec(%s) = %+v, %v", v, got, err)
	}
	old := strings.Replace(v, fmt.Sprintf(`"version":%d`, SpecVersion), fmt.Sprintf(`"version":%d`, SpecVersion-1), 1)
	if old == v {
		t.Fatalf("no version in %s", v)
	}
	if _, err := DecodeSpec(old); err == nil || !strings.Contains(err.Error(), "of one build") {
		t.Errorf("a spec of version 0: %v, want refused", err)
	}
}
