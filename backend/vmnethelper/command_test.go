package vmnethelper

import (
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// testNetworksYAML is loaded through api.LoadNetworks, so the networks carry
// the defaults vmnetctl applies.
const testNetworksYAML = `paths:
  vmnetHelper: /opt/vmnet-helper/bin/vmnet-helper
networks:
  shared:
    mode: shared
    gateway: 192.168.105.1
    dhcpEnd: 192.168.105.254
    netmask: 255.255.255.0
  host:
    mode: host
    gateway: 192.168.106.1
    dhcpEnd: 192.168.106.200
    netmask: 255.255.255.0
  bridged:
    mode: bridged
    interface: en0
vmnet:
  isolated:
    mode: host
    subnet: 192.168.107.0/24
    isolation: true
  isolated-shared:
    mode: shared
    subnet: 192.168.108.0/24
    isolation: true
  small:
    mode: shared
    subnet: 10.20.0.0/16
  v6off:
    subnet: 10.40.0.0/24
    ipv6: false
  v6set:
    subnet: 10.41.0.0/24
    subnet6: fd00:41::/64
  custom:
    subnet: 10.30.0.0/16
    mtu: 9000
    dhcp: false
    dnsProxy: false
    nat44: false
    nat66: false
    routerAdvertisement: false
    leaseTime: 1h
    dhcpRange: {start: 10.30.1.0, end: 10.30.1.255}
    reservations:
      "52:55:55:12:34:56": 10.30.0.10
      "52:55:55:12:34:57": 10.30.0.11
  jumbo-bridge:
    mode: bridged
    interface: en1
    mtu: 9000
`

func testNetworks(t testing.TB) *api.Networks {
	t.Helper()
	nets, diags := api.LoadNetworks("networks.yaml", []byte(testNetworksYAML))
	if nets == nil {
		t.Fatalf("LoadNetworks: %v", diags)
	}
	return nets
}

func testNetwork(t testing.TB, id string) *api.Network {
	t.Helper()
	n := testNetworks(t).Get(id)
	if n == nil {
		t.Fatalf("no network %q", id)
	}
	return n
}

const testHelperPath = "/opt/vmnet-helper/bin/vmnet-helper"

func mustAddr(s string) netip.Addr     { return netip.MustParseAddr(s) }
func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func TestVMNetHelperCommandGolden(t *testing.T) {
	id := api.InterfaceID("vm1", 0, "52:55:55:12:34:56")
	tests := []struct {
		name string
		opts Options
	}{
		{"shared", Options{Socket: "/var/run/vmnetctl/vms/vm1/0.sock", FD: -1, InterfaceID: id, Network: testNetwork(t, "shared"), StatsInterval: 10 * time.Second}},
		{"host", Options{Socket: "/var/run/vmnetctl/vms/vm1/0.sock", FD: -1, InterfaceID: id, Network: testNetwork(t, "host")}},
		{"bridged", Options{Socket: "/var/run/vmnetctl/vms/vm1/0.sock", FD: -1, InterfaceID: id, Network: testNetwork(t, "bridged")}},
		{"isolation", Options{Socket: "/var/run/vmnetctl/vms/vm1/0.sock", FD: -1, InterfaceID: id, Network: testNetwork(t, "isolated")}},
		{"isolation-shared", Options{Socket: "/var/run/vmnetctl/vms/vm1/0.sock", FD: -1, InterfaceID: id, Network: testNetwork(t, "isolated-shared")}},
		{"offloads", Options{Socket: "/var/run/vmnetctl/vms/vm1/0.sock", FD: -1, InterfaceID: id, Network: testNetwork(t, "small"), TSO: true, ChecksumOffload: true, StatsInterval: 1500 * time.Millisecond, Verbose: true}},
		{"broker-network", Options{Socket: "/var/run/vmnetctl/vms/vm1/0.sock", FD: -1, InterfaceID: id, BrokerNetwork: "shared"}},
		{"broker-network-isolation", Options{Socket: "/var/run/vmnetctl/vms/vm1/0.sock", FD: -1, InterfaceID: id, BrokerNetwork: "shared", Isolation: true}},
		{"sudo-fd", Options{FD: 3, InterfaceID: id, Network: testNetwork(t, "shared"), Sudo: true, StatsInterval: 10 * time.Second}},
		{"sudo-socket", Options{Socket: "/var/run/vmnetctl/vms/vm1/0.sock", FD: -1, InterfaceID: id, Network: testNetwork(t, "shared"), Sudo: true}},
		{"no-interface-id", Options{FD: 4, Network: testNetwork(t, "host")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.opts.Path = testHelperPath
			argv, err := Command(tt.opts)
			if err != nil {
				t.Fatalf("Command() error = %v", err)
			}
			testutil.Golden(t, filepath.Join("testdata", tt.name+".golden"), strings.Join(argv, "\n")+"\n")
		})
	}
}

func TestVMNetHelperCommandErrors(t *testing.T) {
	shared := testNetwork(t, "shared")
	bridged := testNetwork(t, "bridged")
	with := func(n *api.Network, f func(*api.Network)) *api.Network {
		c := *n
		f(&c)
		return &c
	}
	tests := []struct {
		name    string
		opts    Options
		wantErr string
	}{
		{"no path", Options{FD: 3, Network: shared}, "no path"},
		{"socket and fd", Options{Path: "h", Socket: "/s", FD: 3, Network: shared}, "not both"},
		{"neither socket nor fd", Options{Path: "h", FD: -1, Network: shared}, "needs a socket path or an fd"},
		{"fd zero (FD left unset)", Options{Path: "h", Network: shared}, "fd 0 is stdin"},
		{"fd 2", Options{Path: "h", FD: 2, Network: shared}, "fd 2"},
		{"long socket", Options{Path: "h", FD: -1, Socket: "/" + strings.Repeat("x", 103), Network: shared}, "more than macOS's limit"},
		{"bad interface id", Options{Path: "h", FD: 3, InterfaceID: "vm1-0", Network: shared}, "not a UUID"},
		{"no network", Options{Path: "h", FD: 3}, "no network"},
		{"network and broker", Options{Path: "h", FD: 3, Network: shared, BrokerNetwork: "shared"}, "not both"},
		{"broker name like a flag", Options{Path: "h", FD: 3, BrokerNetwork: "--x"}, "starts with '-'"},
		{"isolation on bridged", Options{Path: "h", FD: 3, Network: with(bridged, func(n *api.Network) { n.Isolation = true })}, "vmnet-helper refuses --enable-isolation with --operation-mode bridged"},
		{"bridged without interface", Options{Path: "h", FD: 3, Network: with(bridged, func(n *api.Network) { n.Interface = "" })}, "needs an interface"},
		{"user-v2", Options{Path: "h", FD: 3, Network: with(shared, func(n *api.Network) { n.Mode = api.ModeUserV2 })}, "is not one vmnet-helper runs"},
		{"public subnet", Options{Path: "h", FD: 3, Network: &api.Network{ID: "pub", Mode: api.ModeShared,
			Subnet: mustPrefix("100.64.0.0/24"), Gateway: mustAddr("100.64.0.1"), DHCPStart: mustAddr("100.64.0.2"), DHCPEnd: mustAddr("100.64.0.254")}}, "private (RFC 1918)"},
		{"end outside subnet", Options{Path: "h", FD: 3, Network: with(shared, func(n *api.Network) { n.DHCPEnd = mustAddr("192.168.106.9") })}, "both in 192.168.105.0/24"},
		{"negative stats interval", Options{Path: "h", FD: 3, Network: shared, StatsInterval: -time.Second}, "negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			argv, err := Command(tt.opts)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Command() = %q, %v; want an error containing %q", argv, err, tt.wantErr)
			}
		})
	}
}

func TestVMNetHelperWarnings(t *testing.T) {
	nets := testNetworks(t)
	tests := []struct {
		id   string
		want []string // substrings, one per warning, in order
	}{
		{"shared", []string{"dnsProxy: the names of VMs"}},
		{"host", []string{"dnsProxy: the names of VMs"}},
		{"isolated", []string{"dnsProxy: the names of VMs"}},
		{"isolated-shared", []string{"dnsProxy: the names of VMs"}},
		{"bridged", nil},
		{"v6off", []string{"dnsProxy: the names of VMs", "ipv6: false cannot be honoured"}},
		{"v6set", []string{"dnsProxy: the names of VMs", "subnet6: fd00:41::/64 cannot be honoured on macOS: vmnet chooses the IPv6 prefix itself"}},
		{"jumbo-bridge", []string{"mtu: 9000 cannot be honoured"}},
		{"custom", []string{
			"mtu: 9000 cannot be honoured on macOS: vmnet-helper has no MTU option",
			"dhcp: false cannot be honoured",
			"dhcpRange: the start 10.30.1.0 cannot be honoured on macOS: vmnet's DHCP pool starts right after the gateway, so it is 10.30.0.2-10.30.1.255",
			"reservations: 2 reservations cannot be honoured",
			"leaseTime: 1h0m0s cannot be honoured",
			"dnsProxy: false cannot be honoured on macOS: vmnet always offers its DNS proxy on the gateway 10.30.0.1",
			"nat44: false cannot be honoured",
			"nat66: false cannot be honoured",
			"routerAdvertisement: false cannot be honoured",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.id, func(t *testing.T) {
			got := NetworkWarnings(nets.Get(tt.id))
			if len(got) != len(tt.want) {
				t.Fatalf("NetworkWarnings(%s) = %d warnings, want %d:\n%s", tt.id, len(got), len(tt.want), strings.Join(got, "\n"))
			}
			for i, w := range got {
				if !strings.Contains(w, tt.want[i]) {
					t.Errorf("warning %d = %q, want one containing %q", i, w, tt.want[i])
				}
				if strings.HasSuffix(w, ".") {
					t.Errorf("warning %d ends with a period: %q", i, w)
				}
			}
		})
	}
	// A host network does not NAT: nat44/nat66 false are honoured there.
	host := *nets.Get("host")
	host.NAT44, host.NAT66 = false, false
	for _, w := range NetworkWarnings(&host) {
		if strings.HasPrefix(w, "nat") {
			t.Errorf("host network warned %q", w)
		}
	}
	// user-v2 is lima's: nothing to say.
	if w := NetworkWarnings(&api.Network{ID: "u", Mode: api.ModeUserV2, MTU: 9000}); w != nil {
		t.Errorf("user-v2 warnings = %q", w)
	}
}

type fakeFileInfo struct {
	name string
	mode fs.FileMode
}

func (f fakeFileInfo) Name() string       { return f.name }
func (f fakeFileInfo) Size() int64        { return 1 }
func (f fakeFileInfo) Mode() fs.FileMode  { return f.mode }
func (f fakeFileInfo) ModTime() time.Time { return time.Time{} }
func (f fakeFileInfo) IsDir() bool        { return f.mode.IsDir() }
func (f fakeFileInfo) Sys() any           { return nil }

func fakeStat(files map[string]fs.FileMode) func(string) (os.FileInfo, error) {
	return func(p string) (os.FileInfo, error) {
		m, ok := files[p]
		if !ok {
			return nil, &fs.PathError{Op: "stat", Path: p, Err: fs.ErrNotExist}
		}
		return fakeFileInfo{filepath.Base(p), m}, nil
	}
}

func TestFindVMNetHelper(t *testing.T) {
	const (
		brew    = "/opt/homebrew/bin/vmnet-helper"
		intel   = "/usr/local/bin/vmnet-helper"
		release = "/opt/vmnet-helper/bin/vmnet-helper"
	)
	tests := []struct {
		name       string
		configured string
		files      map[string]fs.FileMode
		want       string
		wantErr    string
	}{
		{"configured", "/custom/vmnet-helper", map[string]fs.FileMode{"/custom/vmnet-helper": 0o755, brew: 0o755}, "/custom/vmnet-helper", ""},
		{"configured missing, no fallback", "/custom/vmnet-helper", map[string]fs.FileMode{brew: 0o755}, "", "paths.vmnetHelper in networks.yaml: /custom/vmnet-helper does not exist"},
		{"homebrew first", "", map[string]fs.FileMode{brew: 0o755, release: 0o755}, brew, ""},
		{"intel homebrew", "", map[string]fs.FileMode{intel: 0o555, release: 0o755}, intel, ""},
		{"release archive", "", map[string]fs.FileMode{release: 0o755}, release, ""},
		{"none", "", nil, "", "tried /opt/homebrew/bin/vmnet-helper (not found), /usr/local/bin/vmnet-helper (not found), /opt/vmnet-helper/bin/vmnet-helper (not found)"},
		{"world-writable", "", map[string]fs.FileMode{release: 0o777}, "", "writable by group or others"},
		{"not executable", "", map[string]fs.FileMode{release: 0o644}, "", "not executable"},
		{"directory", "", map[string]fs.FileMode{brew: fs.ModeDir | 0o755, release: 0o755}, "", "not a regular file"},
		{"setuid is fine", "", map[string]fs.FileMode{release: fs.ModeSetuid | 0o755}, release, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Find(tt.configured, fakeStat(tt.files))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Find() = %q, %v; want an error containing %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("Find() = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

type ownedFileInfo struct {
	fakeFileInfo
	uid int // -1: unknown
}

func TestCheckVMNetHelperOwner(t *testing.T) {
	type entry struct {
		mode fs.FileMode
		uid  int
	}
	root := map[string]entry{
		"/":                                  {fs.ModeDir | 0o755, 0},
		"/opt":                               {fs.ModeDir | 0o755, 0},
		"/opt/vmnet-helper":                  {fs.ModeDir | 0o755, 0},
		"/opt/vmnet-helper/bin":              {fs.ModeDir | 0o755, 0},
		"/opt/vmnet-helper/bin/vmnet-helper": {0o755, 0},
	}
	with := func(p string, e entry) map[string]entry {
		m := map[string]entry{}
		for k, v := range root {
			m[k] = v
		}
		m[p] = e
		return m
	}
	tests := []struct {
		name    string
		path    string
		files   map[string]entry
		wantErr string
	}{
		{"root's", "/opt/vmnet-helper/bin/vmnet-helper", root, ""},
		{"setuid root's", "/opt/vmnet-helper/bin/vmnet-helper", with("/opt/vmnet-helper/bin/vmnet-helper", entry{fs.ModeSetuid | 0o755, 0}), ""},
		{"user's file", "/opt/vmnet-helper/bin/vmnet-helper", with("/opt/vmnet-helper/bin/vmnet-helper", entry{0o755, 501}), "/opt/vmnet-helper/bin/vmnet-helper is owned by uid 501"},
		{"user's directory", "/opt/vmnet-helper/bin/vmnet-helper", with("/opt/vmnet-helper", entry{fs.ModeDir | 0o755, 501}), "/opt/vmnet-helper is owned by uid 501"},
		{"group-writable directory", "/opt/vmnet-helper/bin/vmnet-helper", with("/opt", entry{fs.ModeDir | 0o775, 0}), "/opt is writable by group or others"},
		{"sticky /tmp", "/opt/vmnet-helper/bin/vmnet-helper", with("/opt/vmnet-helper/bin", entry{fs.ModeDir | fs.ModeSticky | 0o777, 0}), "writable by group or others"},
		{"owner unknown", "/opt/vmnet-helper/bin/vmnet-helper", with("/opt/vmnet-helper/bin/vmnet-helper", entry{0o755, -1}), "cannot tell the owner"},
		{"missing", "/opt/vmnet-helper/bin/other", root, "not exist"},
		{"relative", "vmnet-helper", root, "not absolute"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stat := func(p string) (os.FileInfo, error) {
				e, ok := tt.files[p]
				if !ok {
					return nil, &fs.PathError{Op: "stat", Path: p, Err: fs.ErrNotExist}
				}
				return ownedFileInfo{fakeFileInfo{filepath.Base(p), e.mode}, e.uid}, nil
			}
			uid := func(fi os.FileInfo) (uint32, bool) {
				u := fi.(ownedFileInfo).uid
				return uint32(u), u >= 0
			}
			err := CheckOwner(tt.path, stat, uid)
			if tt.wantErr == "" && err != nil {
				t.Fatalf("CheckOwner() = %v", err)
			}
			if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("CheckOwner() = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}
