package dnsproxy

import "testing"

func TestLocalName(t *testing.T) {
	for _, tc := range []struct {
		q            string
		name         string
		inZone, isOK bool
	}{
		{"vm1.vmnet.internal.", "vm1", true, true},
		{"VM1.VMNET.Internal.", "vm1", true, true},
		{"a.b.vmnet.internal.", "", true, false},
		{"vmnet.internal.", "", true, false},
		{"vm1.", "vm1", false, true},
		{"example.com.", "", false, false},
	} {
		name, inZone, ok := LocalName(tc.q)
		if name != tc.name || inZone != tc.inZone || ok != tc.isOK {
			t.Errorf("LocalName(%q) = %q, %v, %v; want %q, %v, %v", tc.q, name, inZone, ok, tc.name, tc.inZone, tc.isOK)
		}
	}
}
