package vmnethelper

import (
	"net/netip"
	"strings"
	"testing"
	"time"
)

// FuzzParseLooseMAC checks that an accepted MAC is six octets, that its
// canonical form parses back to it, and that LookupLease finds a lease by
// any spelling of its MAC.
func FuzzParseLooseMAC(f *testing.F) {
	for _, s := range []string{"52:55:55:1:2:3", "52-55-55-01-02-03", " 0:0:0:0:0:0 ", "AA:BB:CC:DD:EE:FF", "1::2:3:4:5",
		"123:0:0:0:0:0", "1:2:3:4:5:6:7", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		mac, err := ParseLooseMAC(s)
		if err != nil {
			if mac != nil {
				t.Fatalf("ParseLooseMAC(%q) = %v and %v", s, mac, err)
			}
			return
		}
		if len(mac) != 6 {
			t.Fatalf("ParseLooseMAC(%q) = %v", s, mac)
		}
		again, err := ParseLooseMAC(mac.String())
		if err != nil || again.String() != mac.String() {
			t.Fatalf("ParseLooseMAC(%q) = %v; its canonical form parses as %v, %v", s, mac, again, err)
		}
		leases := []DHCPDLease{{IP: netip.MustParseAddr("192.168.105.2"), MAC: mac}}
		if l, ok := LookupLease(leases, s); !ok || l.MAC.String() != mac.String() {
			t.Fatalf("LookupLease(%q) = %v, %v", s, l, ok)
		}
	})
}

// FuzzCurrentLeases parses arbitrary dhcpd_leases files and checks what a
// network's status would show: only leases of the subnet that have not
// expired, at most one per MAC (one per address for leases without MAC),
// each the one that expires last, and LookupLease's choice for its MAC
// among the current ones.
func FuzzCurrentLeases(f *testing.F) {
	for _, s := range []string{leasesClassic, leasesSystemdDUID, leasesDUIDLLT, leasesDUIDLL, leasesStale,
		leasesStale + leasesClassic + leasesSystemdDUID + leasesSystemdDUID + leasesDUIDLLT,
		"{\n\tip_address=192.168.105.9\n\thw_address=1,52:55:55:1:2:3\n\tlease=0x67f0a1b2\n}\n" +
			"{\n\tip_address=192.168.105.8\n\thw_address=1,52:55:55:1:2:3\n\tlease=0x67f0a1b2\n}\n"} {
		f.Add([]byte(s), int64(0x67f0a1b3))
	}
	subnet := netip.MustParsePrefix("192.168.105.0/24")
	f.Fuzz(func(t *testing.T, data []byte, unix int64) {
		leases, _ := ParseDHCPDLeases(data)
		now := time.Unix(unix, 0)
		cur := CurrentLeases(leases, subnet, now)
		seen := map[string]bool{}
		for _, l := range cur {
			if !subnet.Contains(l.IP) {
				t.Fatalf("current lease %v outside %s", l, subnet)
			}
			if !l.Expires.IsZero() && !l.Expires.After(now) {
				t.Fatalf("current lease %v expired at %s", l, now)
			}
			key := "ip:" + l.IP.String()
			if l.MAC != nil {
				key = l.MAC.String()
			}
			if seen[key] {
				t.Fatalf("two current leases for %s in %v", key, cur)
			}
			seen[key] = true
			if l.MAC == nil {
				continue
			}
			best, ok := LookupLease(cur, l.MAC.String())
			if !ok || best.Line != l.Line {
				t.Fatalf("current lease %v, LookupLease picks %v", l, best)
			}
			for _, o := range leases {
				if o.MAC != nil && o.MAC.String() == l.MAC.String() && subnet.Contains(o.IP) &&
					(o.Expires.IsZero() || o.Expires.After(now)) && o.Expires.After(l.Expires) {
					t.Fatalf("current lease %v, but %v expires later", l, o)
				}
			}
		}
		for _, l := range leases {
			if strings.ContainsAny(l.Name, "\n") {
				t.Fatalf("lease name %q spans lines", l.Name)
			}
		}
	})
}
