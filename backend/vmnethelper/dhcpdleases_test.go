package vmnethelper

import (
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// Samples in the shapes bootpd writes (tab-indented key=value lines, octets
// without leading zeros, newest block first), including the client-id forms
// reported for VMs on vmnet: a systemd DUID-EN (Ubuntu, Debian cloud
// images), a DUID-LLT (dhclient, Alpine), and a DUID-LL.
const (
	leasesClassic = "{\n" +
		"\tname=vm1\n" +
		"\tip_address=192.168.105.2\n" +
		"\thw_address=1,52:55:55:12:34:56\n" +
		"\tidentifier=1,52:55:55:12:34:56\n" +
		"\tlease=0x67f0a1b2\n" +
		"}\n" +
		"{\n" +
		"\tname=vm2\n" +
		"\tip_address=192.168.105.3\n" +
		"\thw_address=1,52:55:55:1:2:3\n" +
		"\tidentifier=1,52:55:55:1:2:3\n" +
		"\tlease=0x67f0a1b3\n" +
		"}\n"

	// Ubuntu's systemd-networkd: an RFC 4361 client id with a DUID-EN
	// (type 2, enterprise 43793): no MAC in it.
	leasesSystemdDUID = "{\n" +
		"\tname=ubuntu\n" +
		"\tip_address=192.168.64.3\n" +
		"\thw_address=ff,f1:f5:dd:7f:0:2:0:0:ab:11:cb:fb:30:b0:97:b6:3a:67\n" +
		"\tidentifier=ff,f1:f5:dd:7f:0:2:0:0:ab:11:cb:fb:30:b0:97:b6:3a:67\n" +
		"\tlease=0x678e2ce7\n" +
		"}\n"

	// An IAID, then a DUID-LLT (type 1, Ethernet, time) of 52:54:00:12:34:56.
	leasesDUIDLLT = "{\n" +
		"\tname=alpine\n" +
		"\tip_address=192.168.64.4\n" +
		"\thw_address=ff,29:a7:24:ff:0:1:0:1:31:86:54:f0:52:54:0:12:34:56\n" +
		"\tidentifier=ff,29:a7:24:ff:0:1:0:1:31:86:54:f0:52:54:0:12:34:56\n" +
		"\tlease=0x69f83b1e\n" +
		"}\n"

	// An IAID, then a DUID-LL (type 3, Ethernet) of 52:55:55:aa:b:c.
	leasesDUIDLL = "{\n" +
		"\tname=ll\n" +
		"\tip_address=192.168.105.9\n" +
		"\thw_address=ff,55:aa:b:c:0:3:0:1:52:55:55:aa:b:c\n" +
		"\tidentifier=ff,55:aa:b:c:0:3:0:1:52:55:55:aa:b:c\n" +
		"\tlease=0x69000000\n" +
		"}\n"

	// Stale leases of one MAC: a restarted VM got a new address.
	leasesStale = "{\n" +
		"\tname=vm1\n" +
		"\tip_address=192.168.105.7\n" +
		"\thw_address=1,52:55:55:12:34:56\n" +
		"\tidentifier=1,52:55:55:12:34:56\n" +
		"\tlease=0x67f0b000\n" +
		"}\n" +
		"{\n" +
		"\tname=vm1\n" +
		"\tip_address=192.168.105.2\n" +
		"\thw_address=1,52:55:55:12:34:56\n" +
		"\tidentifier=1,52:55:55:12:34:56\n" +
		"\tlease=0x67f0a1b2\n" +
		"}\n"
)

func TestParseDHCPDLeases(t *testing.T) {
	leases, err := ParseDHCPDLeases([]byte(leasesClassic + leasesSystemdDUID + leasesDUIDLLT + leasesDUIDLL))
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		name, ip, mac string
		expires       int64
	}{
		{"vm1", "192.168.105.2", "52:55:55:12:34:56", 0x67f0a1b2},
		{"vm2", "192.168.105.3", "52:55:55:01:02:03", 0x67f0a1b3},
		{"ubuntu", "192.168.64.3", "", 0x678e2ce7},
		{"alpine", "192.168.64.4", "52:54:00:12:34:56", 0x69f83b1e},
		{"ll", "192.168.105.9", "52:55:55:aa:0b:0c", 0x69000000},
	}
	if len(leases) != len(want) {
		t.Fatalf("got %d leases, want %d: %v", len(leases), len(want), leases)
	}
	for i, w := range want {
		l := leases[i]
		mac := ""
		if l.MAC != nil {
			mac = l.MAC.String()
		}
		if l.Name != w.name || l.IP.String() != w.ip || mac != w.mac || !l.Expires.Equal(time.Unix(w.expires, 0)) {
			t.Errorf("lease %d = %s (%+v), want %+v", i, l, l, w)
		}
	}
	if leases[2].HWAddress != "ff,f1:f5:dd:7f:0:2:0:0:ab:11:cb:fb:30:b0:97:b6:3a:67" || leases[0].Identifier != "1,52:55:55:12:34:56" || leases[1].Line != 8 {
		t.Errorf("raw fields: %+v %+v", leases[2], leases[0])
	}
}

func TestParseDHCPDLeasesProblems(t *testing.T) {
	tests := []struct {
		name    string
		data    string
		wantIPs []string
		wantErr string // "" for none
	}{
		{"empty", "", nil, ""},
		{"spaces instead of tabs, blank lines, unknown key", "\n{\n    name=a\n    ip_address=10.0.0.2\n    hw_address=1,2:0:0:0:0:1\n    future=1\n}\n\n", []string{"10.0.0.2"}, ""},
		{"no name, no identifier, no lease", "{\n\tip_address=10.0.0.3\n\thw_address=1,2:0:0:0:0:1\n}\n", []string{"10.0.0.3"}, ""},
		{"truncated last block is a write in progress", leasesClassic + "{\n\tname=partial\n\tip_address=192.168.105.20\n", []string{"192.168.105.2", "192.168.105.3"}, ""},
		{"no ip_address", "{\n\tname=x\n}\n" + leasesClassic, []string{"192.168.105.2", "192.168.105.3"}, "line 1: lease without ip_address"},
		{"bad ip_address", "{\n\tip_address=fd00::5\n}\n", nil, "line 2: ip_address \"fd00::5\" is not an IPv4 address"},
		{"bad hw_address", "{\n\tip_address=10.0.0.4\n\thw_address=1,not-a-mac\n}\n", nil, "hw_address \"1,not-a-mac\""},
		{"empty hw_address", "{\n\tip_address=10.0.0.4\n\thw_address=1,\n}\n", nil, "no address"},
		{"bad lease", "{\n\tip_address=10.0.0.4\n\tlease=soon\n}\n", nil, "lease \"soon\""},
		{"not key=value", "{\n\tip_address=10.0.0.4\n\tgarbage\n}\n", nil, "is not key=value"},
		{"outside a block", "ip_address=10.0.0.5\n" + leasesClassic, []string{"192.168.105.2", "192.168.105.3"}, "outside a block"},
		{"stray close", "}\n", nil, "} outside a block"},
		{"unclosed then another", "{\n\tip_address=10.0.0.6\n{\n\tip_address=10.0.0.7\n}\n", []string{"10.0.0.7"}, "line 1: block not closed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			leases, err := ParseDHCPDLeases([]byte(tt.data))
			if tt.wantErr == "" && err != nil {
				t.Errorf("error = %v", err)
			}
			if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("error = %v, want one containing %q", err, tt.wantErr)
			}
			var ips []string
			for _, l := range leases {
				ips = append(ips, l.IP.String())
			}
			if strings.Join(ips, " ") != strings.Join(tt.wantIPs, " ") {
				t.Errorf("leases = %v, want %v", ips, tt.wantIPs)
			}
		})
	}
}

func TestLookupLease(t *testing.T) {
	all := leasesClassic + leasesSystemdDUID + leasesDUIDLLT + leasesDUIDLL
	tests := []struct {
		name, data, mac, wantIP string
	}{
		{"padded needle, unpadded file", all, "52:55:55:01:02:03", "192.168.105.3"},
		{"unpadded needle", all, "52:55:55:1:2:3", "192.168.105.3"},
		{"upper case", all, "52:55:55:AA:0B:0C", "192.168.105.9"},
		{"dashes", all, "52-55-55-12-34-56", "192.168.105.2"},
		{"DUID-LLT", all, "52:54:00:12:34:56", "192.168.64.4"},
		{"DUID-LL", all, "52:55:55:aa:b:c", "192.168.105.9"},
		{"a DUID-EN has no MAC", all, "cb:fb:30:b0:97:b6", ""},
		{"the IAID is not the MAC", all, "00:00:29:a7:24:ff", ""},
		{"stale lease loses to the later one", leasesStale, "52:55:55:12:34:56", "192.168.105.7"},
		{"stale lease loses, whatever the order", leasesStale[strings.Index(leasesStale, "}\n")+2:] + leasesStale[:strings.Index(leasesStale, "}\n")+2], "52:55:55:12:34:56", "192.168.105.7"},
		{"unknown MAC", all, "52:55:55:00:00:99", ""},
		{"garbage needle", all, "nope", ""},
		{"empty needle", all, "", ""},
		{"EUI-64 needle", all, "52:55:55:12:34:56:00:01", ""},
		{"a 6-byte ff client id is not a MAC", "{\n\tip_address=10.0.0.8\n\thw_address=ff,0:2:0:0:ab:cd\n}\n", "00:02:00:00:ab:cd", ""},
		{"identifier carries the MAC when hw_address does not", "{\n\tip_address=10.0.0.9\n\thw_address=ff,1:2:3:4:0:2:0:0:ab:11:1:2\n\tidentifier=1,52:55:55:9:9:9\n}\n", "52:55:55:09:09:09", "10.0.0.9"},
		{"hw_address wins over a different identifier", "{\n\tip_address=10.0.0.10\n\thw_address=1,52:55:55:a:a:a\n\tidentifier=1,52:55:55:b:b:b\n}\n", "52:55:55:0b:0b:0b", ""},
		{"DUID-LLT of another hardware type", "{\n\tip_address=10.0.0.11\n\thw_address=ff,1:2:3:4:0:1:0:6:31:86:54:f0:52:54:0:12:34:57\n}\n", "52:54:00:12:34:57", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			leases, err := ParseDHCPDLeases([]byte(tt.data))
			if err != nil {
				t.Fatal(err)
			}
			l, ok := LookupLease(leases, tt.mac)
			if ok != (tt.wantIP != "") || (ok && l.IP.String() != tt.wantIP) {
				t.Errorf("LookupLease(%q) = %v, %v; want %q", tt.mac, l, ok, tt.wantIP)
			}
		})
	}
}

func TestParseLooseMAC(t *testing.T) {
	for in, want := range map[string]string{
		"52:55:55:1:2:3":    "52:55:55:01:02:03",
		"52-55-55-01-02-03": "52:55:55:01:02:03",
		" 0:0:0:0:0:0 ":     "00:00:00:00:00:00",
		"AA:BB:CC:DD:EE:FF": "aa:bb:cc:dd:ee:ff",
	} {
		got, err := ParseLooseMAC(in)
		if err != nil || got.String() != want {
			t.Errorf("ParseLooseMAC(%q) = %v, %v; want %s", in, got, err, want)
		}
	}
	for _, in := range []string{"", "1:2:3:4:5", "1:2:3:4:5:6:7", "123:0:0:0:0:0", "g:0:0:0:0:0", "1::2:3:4:5", "5255.5512.3456"} {
		if got, err := ParseLooseMAC(in); err == nil {
			t.Errorf("ParseLooseMAC(%q) = %v, want an error", in, got)
		}
	}
}

func FuzzParseDHCPDLeases(f *testing.F) {
	for _, s := range []string{leasesClassic, leasesSystemdDUID, leasesDUIDLLT, leasesDUIDLL, leasesStale,
		"{\n\tip_address=1.2.3.4\n\thw_address=ff,0:0:0:0:0:3:0:1:1:2:3:4:5:6\n}\n", "{\n}\n}\n=\n\t=\nhw_address\n{", ""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		leases, _ := ParseDHCPDLeases(data)
		for _, l := range leases {
			if !l.IP.Is4() {
				t.Fatalf("lease with IP %v from %q", l.IP, data)
			}
			if l.MAC == nil {
				continue
			}
			if len(l.MAC) != 6 {
				t.Fatalf("lease with MAC %v from %q", l.MAC, data)
			}
			got, ok := LookupLease(leases, l.MAC.String())
			if !ok || !macEqual(got.MAC, l.MAC) || got.Expires.Before(l.Expires) {
				t.Fatalf("LookupLease(%s) = %v, %v; leases %v", l.MAC, got, ok, leases)
			}
		}
	})
}

func macEqual(a, b net.HardwareAddr) bool { return a.String() == b.String() }

func TestCurrentLeases(t *testing.T) {
	leases, err := ParseDHCPDLeases([]byte(leasesStale + leasesClassic + leasesSystemdDUID + leasesSystemdDUID + leasesDUIDLLT))
	if err != nil {
		t.Fatal(err)
	}
	ips := func(ls []DHCPDLease) string {
		var s []string
		for _, l := range ls {
			s = append(s, l.IP.String())
		}
		return strings.Join(s, " ")
	}
	tests := []struct {
		name   string
		subnet string
		now    time.Time
		want   string
	}{
		// vm1's stale .2 loses to .7 (later), the DUID-EN lease appears once.
		{"all", "", time.Time{}, "192.168.105.7 192.168.105.3 192.168.64.3 192.168.64.4"},
		{"one subnet", "192.168.105.0/24", time.Time{}, "192.168.105.7 192.168.105.3"},
		{"other subnet", "192.168.64.0/24", time.Time{}, "192.168.64.3 192.168.64.4"},
		// At 0x67f0a1b3 .3 has just expired (not after now), .7 (0x67f0b000) has not.
		{"expired ones dropped", "192.168.105.0/24", time.Unix(0x67f0a1b3, 0), "192.168.105.7"},
		{"all expired", "192.168.105.0/24", time.Unix(0x70000000, 0), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p netip.Prefix
			if tt.subnet != "" {
				p = netip.MustParsePrefix(tt.subnet)
			}
			if got := ips(CurrentLeases(leases, p, tt.now)); got != tt.want {
				t.Errorf("CurrentLeases() = %q, want %q", got, tt.want)
			}
		})
	}
}
