package api

import (
	"strings"
	"testing"
)

// FuzzNames checks the name rules against the names derived from them: an
// accepted network name gives a bridge name that is a valid interface name
// of at most 15 bytes, and the same one every time; an accepted interface
// name has no byte that a command line or a path would misread.
func FuzzNames(f *testing.F) {
	for _, s := range []string{"shared", "a", "a-very-long-network-name", "a.b_c-d", "-x", "a/b", "..", "ab cd", "é", "x\x00",
		strings.Repeat("n", 63), strings.Repeat("n", 64)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if checkName(s) == "" {
			if len(s) > 63 || s[0] == '-' || s[0] == '.' {
				t.Fatalf("checkName accepted %q", s)
			}
			br := BridgeName(s)
			if msg := checkIfName(br); msg != "" || len(br) > MaxIfNameLen || !strings.HasPrefix(br, BridgePrefix) {
				t.Fatalf("BridgeName(%q) = %q: %s", s, br, msg)
			}
			if BridgeName(s) != br {
				t.Fatalf("BridgeName(%q) is not stable", s)
			}
		}
		if checkIfName(s) == "" {
			if s == "" || len(s) > MaxIfNameLen || s == "." || s == ".." || strings.HasPrefix(s, "-") ||
				strings.ContainsAny(s, "/: \t\n\x00$;&|") {
				t.Fatalf("checkIfName accepted %q", s)
			}
		}
	})
}

// FuzzParseMAC checks that an accepted MAC address is a 48-bit unicast
// address other than all zeros, and that its canonical form parses back to
// the same address.
func FuzzParseMAC(f *testing.F) {
	for _, s := range []string{"52:55:55:12:34:56", "01:00:5e:00:00:01", "00:00:00:00:00:00", "52-55-55-12-34-56",
		"5255.5512.3456", "52:55:55:12:34:56:78:9a", "AA:BB:CC:DD:EE:FE", "52:55:55:1:2:3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		hw, msg := parseMAC(s)
		if msg != "" {
			if hw != nil {
				t.Fatalf("parseMAC(%q) = %v and %q", s, hw, msg)
			}
			return
		}
		if len(hw) != 6 || hw[0]&1 != 0 || isZero(hw) {
			t.Fatalf("parseMAC(%q) accepted %v", s, hw)
		}
		again, msg := parseMAC(hw.String())
		if msg != "" || again.String() != hw.String() || !strings.EqualFold(s, hw.String()) {
			t.Fatalf("parseMAC(%q) = %v; its canonical form parses as %v, %q", s, hw, again, msg)
		}
	})
}
