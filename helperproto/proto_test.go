package helperproto

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseReady(t *testing.T) {
	mac, _ := net.ParseMAC("0a:d6:36:c1:ea:f3")
	tests := []struct {
		name    string
		line    string
		want    Ready
		wantErr string
	}{
		{
			name: "vmnet-helper README",
			line: `{"vmnet_subnet_mask": "255.255.255.0", "vmnet_mtu": 1500, "vmnet_end_address": "192.168.105.254", "vmnet_start_address": "192.168.105.1", "vmnet_interface_id": "2835E074-9892-4A79-AFFB-7E41D2605678", "vmnet_max_packet_size": 1514, "vmnet_nat66_prefix": "fd9b:5a14:ba57:e3d3::", "vmnet_mac_address": "0a:d6:36:c1:ea:f3"}`,
			want: Ready{
				MACAddress: mac, MTU: 1500, MaxPacketSize: 1514,
				InterfaceID:  "2835E074-9892-4A79-AFFB-7E41D2605678",
				StartAddress: netip.MustParseAddr("192.168.105.1"),
				EndAddress:   netip.MustParseAddr("192.168.105.254"),
				SubnetMask:   netip.MustParseAddr("255.255.255.0"),
				NAT66Prefix:  "fd9b:5a14:ba57:e3d3::",
			},
		},
		{
			name: "vmnetctl with --network and unknown keys",
			line: `{"tap_name":"vmt-1","tap_index":7,"net_ipv4_mask":"255.255.255.0","vmnet_max_packet_size":65550,"net_ipv4_subnet":"192.168.105.0","vmnet_mac_address":"0A:D6:36:C1:EA:F3","future_key":[1,2]}`,
			want: Ready{
				MACAddress: mac, MaxPacketSize: 65550, TapName: "vmt-1", TapIndex: 7,
				IPv4Subnet: netip.MustParseAddr("192.168.105.0"),
				IPv4Mask:   netip.MustParseAddr("255.255.255.0"),
			},
		},
		{name: "minimal", line: `{"vmnet_mac_address":"0a:d6:36:c1:ea:f3","vmnet_max_packet_size":1514}`, want: Ready{MACAddress: mac, MaxPacketSize: 1514}},
		{name: "trailing newline", line: "{\"vmnet_mac_address\":\"0a:d6:36:c1:ea:f3\",\"vmnet_max_packet_size\":1514}\n", want: Ready{MACAddress: mac, MaxPacketSize: 1514}},
		{name: "no mac", line: `{"vmnet_max_packet_size":1514}`, wantErr: "vmnet_mac_address is missing"},
		{name: "no max packet size", line: `{"vmnet_mac_address":"0a:d6:36:c1:ea:f3"}`, wantErr: "vmnet_max_packet_size is missing"},
		{name: "bad mac", line: `{"vmnet_mac_address":"0a:d6:36","vmnet_max_packet_size":1514}`, wantErr: "not a 48-bit MAC"},
		{name: "mtu is a string", line: `{"vmnet_mac_address":"0a:d6:36:c1:ea:f3","vmnet_max_packet_size":1514,"vmnet_mtu":"1500"}`, wantErr: "vmnet_mtu: want a non-negative integer"},
		{name: "bad address", line: `{"vmnet_mac_address":"0a:d6:36:c1:ea:f3","vmnet_max_packet_size":1514,"vmnet_start_address":"192.168.105"}`, wantErr: "vmnet_start_address"},
		{name: "not an object", line: `[1]`, wantErr: "not a JSON object"},
		{name: "null", line: `null`, wantErr: "not a JSON object"},
		{name: "empty", line: ``, wantErr: "not a JSON object"},
		{name: "log line", line: `INFO  [main] started`, wantErr: "not a JSON object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseReady([]byte(tt.line))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseReady() error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseReady() error = %v", err)
			}
			if !readyEqual(got, tt.want) {
				t.Errorf("ParseReady() = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func readyEqual(a, b Ready) bool {
	if a.MACAddress.String() != b.MACAddress.String() {
		return false
	}
	a.MACAddress, b.MACAddress = nil, nil
	return reflect.DeepEqual(a, b)
}

func TestReadyRoundTrip(t *testing.T) {
	mac, _ := net.ParseMAC("02:00:00:00:00:01")
	r := Ready{
		MACAddress: mac, MTU: 9000, MaxPacketSize: 9014, InterfaceID: "id",
		StartAddress: netip.MustParseAddr("10.0.0.1"), EndAddress: netip.MustParseAddr("10.0.0.254"),
		SubnetMask: netip.MustParseAddr("255.255.255.0"), IPv4Subnet: netip.MustParseAddr("10.0.0.0"),
		IPv4Mask: netip.MustParseAddr("255.255.255.0"), TapName: "vmt-x", TapIndex: 42,
	}
	b, err := r.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseReady(b)
	if err != nil {
		t.Fatalf("ParseReady(%s): %v", b, err)
	}
	if !readyEqual(got, r) {
		t.Errorf("round trip of %s = %+v, want %+v", b, got, r)
	}
}

func TestParseStatsLine(t *testing.T) {
	tests := []struct {
		name   string
		line   string
		want   Stats
		wantOK bool
	}{
		{
			name:   "vmnet-helper",
			line:   `INFO  [stats] {"time": "2026-11-22T15:00:00.5Z", "host": {"packets": 10, "bytes": 15140, "drops": 1, "fast": 2, "slow": 3}, "vm": {"packets": 4, "bytes": 400, "drops": 0, "fast": 0, "slow": 4}}` + "\n",
			want:   Stats{Time: time.Date(2026, 11, 22, 15, 0, 0, 5e8, time.UTC), Host: Counters{10, 15140, 1, 2, 3}, VM: Counters{4, 400, 0, 0, 4}},
			wantOK: true,
		},
		{
			name:   "epoch time, extra keys",
			line:   `INFO  [stats] {"time": 1700000000, "host": {"packets": 1}, "vm": {}, "other": 1}`,
			want:   Stats{Time: time.Unix(1700000000, 0).UTC(), Host: Counters{Packets: 1}},
			wantOK: true,
		},
		{name: "no time", line: `INFO  [stats] {"host": {}, "vm": {}}`, want: Stats{}, wantOK: true},
		{name: "main line", line: `INFO  [main] started vmnet interface`},
		{name: "debug stats", line: `DEBUG [stats] {"host": {}, "vm": {}}`},
		{name: "missing vm", line: `INFO  [stats] {"host": {}}`},
		{name: "negative", line: `INFO  [stats] {"host": {"packets": -1}, "vm": {}}`},
		{name: "trailing junk", line: `INFO  [stats] {"host": {}, "vm": {}} x`},
		{name: "empty", line: ``},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := ParseStatsLine(tt.line)
			if ok != tt.wantOK {
				t.Fatalf("ParseStatsLine() ok = %v, want %v", ok, tt.wantOK)
			}
			if !got.Time.Equal(tt.want.Time) || got.Host != tt.want.Host || got.VM != tt.want.VM {
				t.Errorf("ParseStatsLine() = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestFormatStatsLineRoundTrip(t *testing.T) {
	s := Stats{Time: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC), Host: Counters{1, 2, 3, 4, 5}, VM: Counters{6, 7, 8, 9, 10}}
	got, ok := ParseStatsLine(FormatStatsLine(s))
	if !ok || !got.Time.Equal(s.Time) || got.Host != s.Host || got.VM != s.VM {
		t.Errorf("round trip of %q = %+v, %v", FormatStatsLine(s), got, ok)
	}
}

func FuzzParseReady(f *testing.F) {
	f.Add([]byte(`{"vmnet_mac_address":"0a:d6:36:c1:ea:f3","vmnet_max_packet_size":1514,"vmnet_mtu":1500}`))
	f.Add([]byte(`{"vmnet_start_address":"192.168.105.1","tap_name":"x","net_ipv4_mask":"255.0.0.0"}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, line []byte) {
		r, err := ParseReady(line)
		if err != nil {
			return
		}
		if len(r.MACAddress) != 6 || r.MaxPacketSize <= 0 {
			t.Fatalf("ParseReady(%q) accepted %+v", line, r)
		}
		b, err := r.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		r2, err := ParseReady(b)
		if err != nil || !readyEqual(r, r2) {
			t.Fatalf("round trip of %q: %+v, %v", line, r2, err)
		}
	})
}

func FuzzParseStatsLine(f *testing.F) {
	f.Add(`INFO  [stats] {"time": "2026-11-22T15:00:00Z", "host": {"packets": 10, "bytes": 15140, "drops": 1, "fast": 2, "slow": 3}, "vm": {"packets": 4}}`)
	f.Add(`INFO  [stats] {"time": 1.5, "host": {}, "vm": {}}`)
	f.Add(`INFO  [main] x`)
	f.Fuzz(func(t *testing.T, line string) {
		s, ok := ParseStatsLine(line)
		if !ok {
			return
		}
		got, ok := ParseStatsLine(FormatStatsLine(s))
		if !ok || got.Host != s.Host || got.VM != s.VM {
			t.Fatalf("round trip of %q: %+v, %v", line, got, ok)
		}
	})
}

// TestShapingsFile: WriteShapings writes a file ReadShapings reads back,
// and says whether it changed anything; none asked and no file, it makes
// none; a file that does not check is an error.
func TestShapingsFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.shaping")
	if changed, err := WriteShapings(path, Shapings{}); changed || err != nil {
		t.Fatalf("no shaping, no file: changed %v, %v", changed, err)
	}
	if _, err := os.Stat(path); err == nil {
		t.Fatal("no shaping made a file")
	}
	s := Shapings{ToVM: Shaping{Delay: 50 * time.Millisecond, Jitter: 5 * time.Millisecond}, FromVM: Shaping{Duplicate: 100}}
	for i, want := range []bool{true, false} {
		if changed, err := WriteShapings(path, s); changed != want || err != nil {
			t.Fatalf("write %d: changed %v (want %v), %v", i, changed, want, err)
		}
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if got, err := ReadShapings(f); err != nil || got != s {
		t.Errorf("read back %+v, %v", got, err)
	}
	if s.ToVM.String() != "delay 50ms ±5ms" || s.FromVM.String() != "duplicate 1%" || (Shaping{}).String() != "nothing" {
		t.Errorf("String: %q, %q", s.ToVM, s.FromVM)
	}
	if changed, err := WriteShapings(path, Shapings{}); !changed || err != nil {
		t.Errorf("cleared: changed %v, %v", changed, err)
	}
	if got, err := ReadShapings(f); err != nil || got != (Shapings{}) {
		t.Errorf("read after clearing %+v, %v", got, err)
	}
	os.WriteFile(path, []byte(`{"toVM":{"delay":1000,"jitter":2000}}`), 0o600)
	if _, err := ReadShapings(f); err == nil || !strings.Contains(err.Error(), "toVM: a jitter of 2µs") {
		t.Errorf("a jitter over its delay: %v", err)
	}
}
