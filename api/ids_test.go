package api

import (
	"crypto/sha256"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"
)

func TestInterfaceID(t *testing.T) {
	a := InterfaceID("vm1", 0, "52:55:55:12:34:56")
	if a != InterfaceID("vm1", 0, "52:55:55:12:34:56") {
		t.Fatal("not stable")
	}
	if !ValidInterfaceID(a) || a != strings.ToUpper(a) {
		t.Fatalf("%q is not an uppercase UUID", a)
	}
	if a[14] != '5' || !strings.ContainsRune("89AB", rune(a[19])) {
		t.Errorf("%q: want version 5 and the RFC 4122 variant", a)
	}
	// The value is pinned: a
	// change would give every VM a new MAC address from vmnet.
	if want := "992D024D-BB19-5176-840B-CCF5D574A0B1"; a != want {
		t.Errorf("InterfaceID = %s, want %s", a, want)
	}
	// So is the TAP's name: a new one would leave every VM's TAP to be
	// made again on upgrade.
	if got, want := TapName(a), "vmt-729a9b79e0"; got != want {
		t.Errorf("TapName(%s) = %s, want %s", a, got, want)
	}
	for _, other := range []string{
		InterfaceID("vm1", 1, "52:55:55:12:34:56"),
		InterfaceID("vm2", 0, "52:55:55:12:34:56"),
		InterfaceID("vm1", 0, "52:55:55:12:34:57"),
	} {
		if other == a {
			t.Errorf("different attachments share the id %s", a)
		}
	}
}

func TestInterfaceMAC(t *testing.T) {
	id := "2835E074-9892-4A79-AFFB-7E41D2605678"
	a, b := InterfaceMAC(id), InterfaceMAC(strings.ToLower(id))
	if a.String() != b.String() {
		t.Errorf("MAC depends on the id's case: %s, %s", a, b)
	}
	if a[0]&0x01 != 0 || a[0]&0x02 == 0 {
		t.Errorf("MAC %s is not locally administered unicast", a)
	}
	if c := InterfaceMAC(NewInterfaceID()); c.String() == a.String() {
		t.Errorf("two ids, one MAC %s", c)
	}
}

func TestInterfaceIDs(t *testing.T) {
	for range 100 {
		id := NewInterfaceID()
		if err := CheckInterfaceID(id); err != nil {
			t.Fatal(err)
		}
	}
	if err := CheckInterfaceID("2835e074-9892-4a79-affb-7e41d2605678"); err != nil {
		t.Errorf("a lower-case UUID: %v", err)
	}
	for _, bad := range []string{"", "2835E074", "2835E074-9892-4A79-AFFB-7E41D260567G", "{2835E074-9892-4A79-AFFB-7E41D2605678}",
		"2835E074-9892-4A79-AFFB-7E41D26056789", "2835E074-9892-4A79-AFFB_7E41D2605678", "2835E074-9892-4A79-AFFB-7E41D260567é",
		"2835E0749-892-4A79-AFFB-7E41D2605678", "2835E074-9892-4A79-AFFB-7E41D260567-"} {
		if CheckInterfaceID(bad) == nil {
			t.Errorf("CheckInterfaceID(%q) accepted it", bad)
		}
	}
	name := TapName("2835E074-9892-4A79-AFFB-7E41D2605678")
	if !strings.HasPrefix(name, TapPrefix) || len(name) > MaxIfNameLen {
		t.Errorf("TapName = %q", name)
	}
}

func TestSubnetMask(t *testing.T) {
	for _, tc := range []struct{ prefix, want string }{
		{"10.0.0.0/22", "255.255.252.0"}, {"192.168.105.0/24", "255.255.255.0"}, {"10.0.0.0/8", "255.0.0.0"},
	} {
		if m := SubnetMask(netip.MustParsePrefix(tc.prefix)); m.String() != tc.want {
			t.Errorf("SubnetMask(%s) = %s, want %s", tc.prefix, m, tc.want)
		}
	}
	if m := SubnetMask(netip.MustParsePrefix("fd00::/64")); m.IsValid() {
		t.Errorf("SubnetMask of an IPv6 prefix = %s", m)
	}
}

// TestAttachmentTapName: an attachment's TAP is the TAP of its interface
// id, derived at one allocation.
func TestAttachmentTapName(t *testing.T) {
	for i, vm := range []string{"a", "vm-1", "Mixed.Case_name", strings.Repeat("x", 63)} {
		for _, index := range []int{0, 1, 9, 10, 123456} {
			mac := fmt.Sprintf("52:55:55:00:%02x:%02x", i, index%256)
			if got, want := AttachmentTapName(vm, index, mac), TapName(InterfaceID(vm, index, mac)); got != want {
				t.Errorf("AttachmentTapName(%q, %d, %q) = %q, want %q", vm, index, mac, got, want)
			}
			// The id as it has always been derived: a helper's MAC and
			// TAP must not change with a new vmnetctl.
			sum := sha256.Sum256([]byte("vmnetctl/" + vm + "/" + strconv.Itoa(index) + "/" + mac))
			sum[6] = sum[6]&0x0f | 0x50
			sum[8] = sum[8]&0x3f | 0x80
			h := fmt.Sprintf("%X", sum[:16])
			if got, want := InterfaceID(vm, index, mac), h[:8]+"-"+h[8:12]+"-"+h[12:16]+"-"+h[16:20]+"-"+h[20:]; got != want {
				t.Errorf("InterfaceID(%q, %d, %q) = %q, want %q", vm, index, mac, got, want)
			}
		}
	}
	if n := testing.AllocsPerRun(100, func() { _ = AttachmentTapName("c00001", 0, "52:55:55:00:00:01") }); n > 1 {
		t.Errorf("AttachmentTapName allocates %v times, want at most once", n)
	}
}
