package helperproto

import (
	"strings"
	"testing"
)

func TestFitsSpare(t *testing.T) {
	prog := "/usr/libexec/vmnetctl-relay"
	const sd = "/run/vmnetctl"
	room := CmdlineLen(SpareArgs(prog, sd))
	for _, tc := range []struct {
		argv []string
		want bool
	}{
		{[]string{"/usr/bin/vmnetctl", "helper", "--socket", "/run/vmnetctl/vms/a/0.sock"}, true},
		{[]string{strings.Repeat("x", room-1)}, true},
		{[]string{strings.Repeat("x", room)}, false}, // its NUL does not fit
		{[]string{"/usr/bin/vmnetctl", "helper", ""}, false},
		{nil, false},
	} {
		if got := FitsSpare(prog, sd, tc.argv); got != tc.want {
			t.Errorf("FitsSpare of %d bytes ending %q = %v, want %v", CmdlineLen(tc.argv), tc.argv[max(len(tc.argv)-1, 0):], got, tc.want)
		}
	}
}

func TestHandOverRoundTrip(t *testing.T) {
	h := HandOver{Argv: []string{"/usr/bin/vmnetctl", "helper"}, Spec: `{"version":4}`, Files: 7}
	b, err := h.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeHandOver(b)
	if err != nil || got.Spec != h.Spec || got.Files != 7 || len(got.Argv) != 2 {
		t.Fatalf("DecodeHandOver(%s) = %+v, %v", b, got, err)
	}
	for _, bad := range []string{`{`, `{"argv":[],"files":3}`, `{"argv":["x"],"files":1}`, `{"argv":["x"],"files":17}`} {
		if _, err := DecodeHandOver([]byte(bad)); err == nil {
			t.Errorf("DecodeHandOver(%s) took it", bad)
		}
	}
	if _, err := (HandOver{Argv: []string{strings.Repeat("x", MaxHandOver)}, Files: 2}).Encode(); err == nil {
		t.Error("Encode took a hand-over past MaxHandOver")
	}
}

func TestIsSpareOf(t *testing.T) {
	spare := SpareArgs("/usr/libexec/vmnetctl-relay", "/run/vmnetctl")
	if !IsSpareOf(spare, "/run/vmnetctl") {
		t.Errorf("IsSpareOf(%q) is false", spare[:3])
	}
	for _, other := range [][]string{
		SpareArgs("/usr/libexec/vmnetctl-relay", "/run/other"),
		{"/usr/bin/vmnetctl", "helper", "/run/vmnetctl", "x"},
		spare[:3],
	} {
		if IsSpareOf(other, "/run/vmnetctl") {
			t.Errorf("IsSpareOf(%.60q) is true", other)
		}
	}
}
