package api

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// want is one expected diagnostic: its line, field and a part of its message.
type want struct {
	line  int
	field string
	msg   string
}

func checkDiags(t *testing.T, got Diagnostics, sev Severity, wants []want) {
	t.Helper()
	got = got.filter(sev).Sorted()
	if len(got) != len(wants) {
		t.Fatalf("got %d diagnostics, want %d:\n%s", len(got), len(wants), diagText(got))
	}
	for i, w := range wants {
		d := got[i]
		if d.Line != w.line || d.Field != w.field || !strings.Contains(d.Message, w.msg) {
			t.Errorf("diagnostic %d = %s\nwant line %d, field %q, message containing %q", i, d, w.line, w.field, w.msg)
		}
	}
}

func diagText(ds Diagnostics) string {
	var b strings.Builder
	for _, d := range ds {
		b.WriteString(d.String() + "\n")
	}
	return b.String()
}

func mustNetworks(t *testing.T, src string) *Networks {
	t.Helper()
	nets, diags := LoadNetworks("networks.yaml", []byte(src))
	if diags.HasErrors() {
		t.Fatalf("unexpected errors:\n%s", diagText(diags))
	}
	return nets
}

var cmpNetwork = cmp.Options{
	cmpopts.IgnoreUnexported(Network{}),
	cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
	cmp.Comparer(func(a, b netip.Prefix) bool { return a == b }),
	cmpopts.IgnoreFields(Reservation{}, "Line"),
}

func TestLoadNetworksDefaults(t *testing.T) {
	a := netip.MustParseAddr
	tests := []struct {
		name string
		src  string
		want []*Network
	}{{
		name: "lima classic shared applies lima's documented defaults",
		src: `
networks:
  shared:
    mode: shared
    gateway: 192.168.105.1
`,
		want: []*Network{{ID: "shared", Name: "shared", Section: SectionNetworks, Mode: ModeShared,
			Subnet: netip.MustParsePrefix("192.168.105.0/24"), Gateway: a("192.168.105.1"),
			DHCPStart: a("192.168.105.2"), DHCPEnd: a("192.168.105.254"), MTU: 1500,
			DHCP: true, DNSProxy: true, DNSForward: ptr(true), NAT44: true, NAT66: true, RouterAdvertisement: true,
			LeaseTime: DefaultLeaseTime, Source: Source{File: "networks.yaml", Line: 3}}},
	}, {
		name: "classic netmask and dhcpEnd",
		src: `
networks:
  host:
    mode: host
    gateway: 10.20.0.1
    dhcpEnd: 10.20.0.100
    netmask: 255.255.0.0
`,
		want: []*Network{{ID: "host", Name: "host", Section: SectionNetworks, Mode: ModeHost,
			Subnet: netip.MustParsePrefix("10.20.0.0/16"), Gateway: a("10.20.0.1"),
			DHCPStart: a("10.20.0.2"), DHCPEnd: a("10.20.0.100"), MTU: 1500,
			DHCP: true, DNSProxy: true, DNSForward: ptr(false), RouterAdvertisement: true, LeaseTime: DefaultLeaseTime, Source: Source{File: "networks.yaml", Line: 3}}},
	}, {
		name: "vmnet section: mode defaults to shared, subnet normalised to its first host as gateway",
		src: `
vmnet:
  shared:
    subnet: 192.168.107.0/24
`,
		want: []*Network{{ID: "shared", Name: "shared", Section: SectionVMNet, Mode: ModeShared,
			Subnet: netip.MustParsePrefix("192.168.107.0/24"), Gateway: a("192.168.107.1"),
			DHCPStart: a("192.168.107.2"), DHCPEnd: a("192.168.107.254"), MTU: 1500,
			DHCP: true, DNSProxy: true, DNSForward: ptr(true), NAT44: true, NAT66: true, RouterAdvertisement: true,
			LeaseTime: DefaultLeaseTime, Source: Source{File: "networks.yaml", Line: 3}}},
	}, {
		name: "vmnet keys and vmnetctl keys",
		src: `
vmnet:
  lab:
    mode: host
    dhcp: false
    dnsProxy: false
    mtu: 9000
    routerAdvertisement: true
    subnet: 172.30.0.0/24
    isolation: true
    leaseTime: 1h
    dhcpRange: {start: 172.30.0.50, end: 172.30.0.60}
    reservations:
      "52:55:55:00:00:01": 172.30.0.10
`,
		want: []*Network{{ID: "lab", Name: "lab", Section: SectionVMNet, Mode: ModeHost,
			Subnet: netip.MustParsePrefix("172.30.0.0/24"), Gateway: a("172.30.0.1"),
			DHCPStart: a("172.30.0.50"), DHCPEnd: a("172.30.0.60"), MTU: 9000,
			DNSForward: ptr(false), RouterAdvertisement: true, Isolation: true, LeaseTime: time.Hour,
			Reservations: []Reservation{{MAC: "52:55:55:00:00:01", IP: a("172.30.0.10")}},
			Source:       Source{File: "networks.yaml", Line: 3}}},
	}, {
		name: "bridged and user-v2",
		src: `
networks:
  user-v2:
    mode: user-v2
    gateway: 192.168.104.1
    netmask: 255.255.255.0
  bridged:
    mode: bridged
    interface: eth0
`,
		want: []*Network{
			{ID: "bridged", Name: "bridged", Section: SectionNetworks, Mode: ModeBridged, Interface: "eth0", MTU: 1500,
				LeaseTime: DefaultLeaseTime, Source: Source{File: "networks.yaml", Line: 7}},
			{ID: "user-v2", Name: "user-v2", Section: SectionNetworks, Mode: ModeUserV2,
				Subnet: netip.MustParsePrefix("192.168.104.0/24"), Gateway: a("192.168.104.1"), MTU: 1500,
				LeaseTime: DefaultLeaseTime, Source: Source{File: "networks.yaml", Line: 3}},
		},
	}, {
		name: "leaseTime in seconds",
		src:  "vmnet:\n  s:\n    subnet: 10.9.0.0/24\n    leaseTime: 120\n",
		want: []*Network{{ID: "s", Name: "s", Section: SectionVMNet, Mode: ModeShared,
			Subnet: netip.MustParsePrefix("10.9.0.0/24"), Gateway: a("10.9.0.1"),
			DHCPStart: a("10.9.0.2"), DHCPEnd: a("10.9.0.254"), MTU: 1500,
			DHCP: true, DNSProxy: true, DNSForward: ptr(true), NAT44: true, NAT66: true, RouterAdvertisement: true,
			LeaseTime: 2 * time.Minute, Source: Source{File: "networks.yaml", Line: 2}}},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nets := mustNetworks(t, tt.src)
			for _, w := range tt.want {
				if w.Routed() { // TestIPv6 checks the prefixes themselves
					w.Subnet6 = ULAPrefix(w.ID)
					w.Gateway6 = Gateway6(w.Subnet6)
				}
			}
			if diff := cmp.Diff(tt.want, nets.Networks, cmpNetwork); diff != "" {
				t.Errorf("networks differ (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLoadNetworksErrors(t *testing.T) {
	tests := []struct {
		name  string
		src   string
		wants []want
	}{
		{"unknown mode", "networks:\n  a:\n    mode: nat\n    gateway: 10.0.0.1\n",
			[]want{{3, "networks.a.mode", `unknown mode "nat"`}}},
		{"mode required in classic section", "networks:\n  a:\n    gateway: 10.0.0.1\n",
			[]want{{2, "networks.a.mode", "is required"}}},
		{"user-v2 only in classic section", "vmnet:\n  a:\n    mode: user-v2\n",
			[]want{{3, "vmnet.a.mode", `unknown mode "user-v2"`}}},
		{"bad CIDR", "vmnet:\n  a:\n    subnet: 10.0.0.0/33\n",
			[]want{{3, "vmnet.a.subnet", "not an IPv4 CIDR"}}},
		{"IPv6 subnet", "vmnet:\n  a:\n    subnet: fd00::/64\n",
			[]want{{3, "vmnet.a.subnet", "not an IPv4 CIDR"}}},
		{"loopback subnet", "vmnet:\n  a:\n    subnet: 127.10.0.0/24\n",
			[]want{{3, "vmnet.a.subnet", "loopback"}}},
		{"multicast subnet", "vmnet:\n  a:\n    subnet: 239.1.0.0/24\n",
			[]want{{3, "vmnet.a.subnet", "multicast"}}},
		{"0.0.0.0/8", "networks:\n  a:\n    mode: host\n    gateway: 0.1.0.1\n",
			[]want{{4, "networks.a.gateway", "0.0.0.0/8"}}},
		{"link-local subnet", "vmnet:\n  a:\n    subnet: 169.254.10.0/24\n",
			[]want{{3, "vmnet.a.subnet", "link-local (169.254.0.0/16)"}}},
		{"link-local gateway", "networks:\n  a:\n    mode: host\n    gateway: 169.254.0.1\n    netmask: 255.255.255.0\n",
			[]want{{4, "networks.a.gateway", "link-local"}}},
		{"reserved subnet", "vmnet:\n  a:\n    subnet: 240.1.0.0/24\n",
			[]want{{3, "vmnet.a.subnet", "reserved (240.0.0.0/4)"}}},
		{"limited broadcast's range", "vmnet:\n  a:\n    subnet: 255.255.255.0/24\n",
			[]want{{3, "vmnet.a.subnet", "reserved (240.0.0.0/4)"}}},
		{"public subnet", "vmnet:\n  a:\n    subnet: 8.8.8.0/24\n",
			[]want{{3, "vmnet.a.subnet", "not a private range"}}},
		{"subnet wider than its private block", "vmnet:\n  a:\n    subnet: 192.168.0.0/15\n",
			[]want{{3, "vmnet.a.subnet", "not a private range"}}},
		{"bridged on lo", "networks:\n  a:\n    mode: bridged\n    interface: lo\n",
			[]want{{4, "networks.a.interface", "loopback"}}},
		{"bridged on a vmnetctl bridge", "networks:\n  a:\n    mode: bridged\n    interface: vmn-shared\n",
			[]want{{4, "networks.a.interface", "vmnetctl's own interfaces"}}},
		{"bridged on a VM's TAP", "networks:\n  a:\n    mode: bridged\n    interface: vmt-0123456789\n",
			[]want{{4, "networks.a.interface", "vmnetctl's own interfaces"}}},
		{"bridged on a tunnel", "networks:\n  a:\n    mode: bridged\n    interface: vmx-lab\n",
			[]want{{4, "networks.a.interface", "vmnetctl's own interfaces"}}},
		{"bridged on a bridge being made", "networks:\n  a:\n    mode: bridged\n    interface: vmn.0123abcd\n",
			[]want{{4, "networks.a.interface", "vmnetctl's own interfaces"}}},
		{"bad address", "networks:\n  a:\n    mode: shared\n    gateway: 192.168.105.300\n",
			[]want{{4, "networks.a.gateway", "not an IPv4 address"}}},
		{"non-contiguous netmask", "networks:\n  a:\n    mode: shared\n    gateway: 10.0.0.1\n    netmask: 255.0.255.0\n",
			[]want{{5, "networks.a.netmask", "not a netmask"}}},
		{"gateway is the network address", "networks:\n  a:\n    mode: shared\n    gateway: 10.0.0.0\n",
			[]want{{4, "networks.a.gateway", "network address"}}},
		{"DHCP end outside the subnet", "networks:\n  a:\n    mode: shared\n    gateway: 10.0.0.1\n    dhcpEnd: 10.0.1.254\n",
			[]want{{5, "networks.a.dhcpEnd", "outside the subnet"}}},
		{"DHCP range reversed", "vmnet:\n  a:\n    subnet: 10.0.0.0/24\n    dhcpRange:\n      start: 10.0.0.200\n      end: 10.0.0.100\n",
			[]want{{6, "vmnet.a.dhcpRange", "reversed"}}},
		{"DHCP range contains the gateway", "vmnet:\n  a:\n    subnet: 10.0.0.5/24\n    dhcpRange: {start: 10.0.0.2, end: 10.0.0.100}\n",
			[]want{{4, "vmnet.a.dhcpRange", "contains the gateway"}}},
		{"dhcpEnd and dhcpRange", "vmnet:\n  a:\n    subnet: 10.0.0.0/24\n    dhcpEnd: 10.0.0.9\n    dhcpRange: {start: 10.0.0.2, end: 10.0.0.100}\n",
			[]want{{5, "vmnet.a.dhcpRange", "either dhcpEnd or dhcpRange"}}},
		{"subnet and gateway", "vmnet:\n  a:\n    subnet: 10.0.0.0/24\n    gateway: 10.0.0.1\n",
			[]want{{4, "vmnet.a.subnet", "either subnet, or gateway"}}},
		{"overlapping subnets", "vmnet:\n  a:\n    subnet: 10.0.0.0/16\n  b:\n    subnet: 10.0.5.0/24\n",
			[]want{{5, "vmnet.b.subnet", `overlaps 10.0.0.0/16 of network "a"`}}},
		{"overlap across sections", "networks:\n  a:\n    mode: shared\n    gateway: 10.0.0.1\nvmnet:\n  b:\n    subnet: 10.0.0.0/24\n",
			[]want{{7, "vmnet.b.subnet", `overlaps 10.0.0.0/24 of network "a"`}}},
		{"bridged without interface", "networks:\n  br:\n    mode: bridged\n",
			[]want{{2, "networks.br.interface", "is required for a bridged network"}}},
		{"bridged with a gateway", "networks:\n  br:\n    mode: bridged\n    interface: eth0\n    gateway: 10.0.0.1\n",
			[]want{{5, "networks.br.gateway", "has no gateway"}}},
		{"interface on a shared network", "networks:\n  a:\n    mode: shared\n    gateway: 10.0.0.1\n    interface: eth0\n",
			[]want{{5, "networks.a.interface", "only bridged networks"}}},
		{"interface name too long", "networks:\n  br:\n    mode: bridged\n    interface: averyveryverylongname\n",
			[]want{{4, "networks.br.interface", "longer than 15"}}},
		{"interface name injection", "networks:\n  br:\n    mode: bridged\n    interface: \"eth0;reboot\"\n",
			[]want{{4, "networks.br.interface", "contains ';'"}}},
		{"network name injection", "vmnet:\n  \"$(reboot)\":\n    subnet: 10.0.0.0/24\n",
			[]want{{2, "vmnet.$(reboot)", "may only contain"}}},
		{"network name with a leading dash", "vmnet:\n  -x:\n    subnet: 10.0.0.0/24\n",
			[]want{{2, "vmnet.-x", "must start with a letter or digit"}}},
		{"MTU out of range", "vmnet:\n  a:\n    subnet: 10.0.0.0/24\n    mtu: 65536\n",
			[]want{{4, "vmnet.a.mtu", "outside 68-65535"}}},
		{"MTU too small", "vmnet:\n  a:\n    subnet: 10.0.0.0/24\n    mtu: 67\n",
			[]want{{4, "vmnet.a.mtu", "outside 68-65535"}}},
		{"unknown key with a suggestion", "vmnet:\n  a:\n    subnet: 10.0.0.0/24\n    dnsproxy: true\n",
			[]want{{4, "vmnet.a.dnsproxy", `did you mean "dnsProxy"?`}}},
		{"unknown top-level key", "netwroks:\n  a:\n    mode: shared\n",
			[]want{{1, "netwroks", `did you mean "networks"?`}}},
		{"yes is not a boolean", "vmnet:\n  a:\n    subnet: 10.0.0.0/24\n    dhcp: yes\n",
			[]want{{4, "vmnet.a.dhcp", "must be true or false"}}},
		{"bad lease time", "vmnet:\n  a:\n    subnet: 10.0.0.0/24\n    leaseTime: forever\n",
			[]want{{4, "vmnet.a.leaseTime", "not a duration"}}},
		{"lease time too short", "vmnet:\n  a:\n    subnet: 10.0.0.0/24\n    leaseTime: 1s\n",
			[]want{{4, "vmnet.a.leaseTime", "outside"}}},
		{"reservation outside the subnet, and a bad MAC", "vmnet:\n  a:\n    subnet: 10.0.0.0/24\n    reservations:\n      \"52:55:55:00:00:01\": 10.0.1.5\n      \"01:00:5e:00:00:01\": 10.0.0.5\n",
			[]want{{5, "vmnet.a.reservations.52:55:55:00:00:01", "outside the subnet"}, {6, "vmnet.a.reservations.01:00:5e:00:00:01", "multicast"}}},
		{"duplicate reserved IP", "vmnet:\n  a:\n    subnet: 10.0.0.0/24\n    reservations:\n      \"52:55:55:00:00:01\": 10.0.0.5\n      \"52:55:55:00:00:02\": 10.0.0.5\n",
			[]want{{6, "vmnet.a.reservations.52:55:55:00:00:02", "reserved twice"}}},
		{"duplicate key", "vmnet:\n  a:\n    subnet: 10.0.0.0/24\n    subnet: 10.0.1.0/24\n",
			[]want{{4, "vmnet.a.subnet", "defined twice (first at line 3)"}}},
		{"invalid YAML", "vmnet:\n  a: [\n", []want{{2, "", "invalid YAML"}}},
		{"empty file", "", []want{{0, "", "defines no networks"}}},
		{"a list instead of a mapping", "networks:\n  - vmnet: shared\n", []want{{2, "networks", "must be a mapping"}}},
		{"gateway required", "networks:\n  a:\n    mode: host\n", []want{{2, "networks.a.gateway", "is required"}}},
		{"every problem at once", "networks:\n  a:\n    mode: nat\n  b:\n    mode: bridged\n  c:\n    mode: shared\n    gateway: 10.0.0.1\n    mtu: 1\n",
			[]want{{3, "networks.a.mode", "unknown mode"}, {4, "networks.b.interface", "is required"}, {9, "networks.c.mtu", "outside"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nets, diags := LoadNetworks("networks.yaml", []byte(tt.src))
			if nets != nil {
				t.Errorf("got networks, want nil on error")
			}
			checkDiags(t, diags, SeverityError, tt.wants)
			for _, d := range diags.Errors() {
				if !strings.HasPrefix(d.String(), "networks.yaml:") {
					t.Errorf("diagnostic %q does not start with the file name", d)
				}
			}
		})
	}
}

func TestLoadNetworksWarnings(t *testing.T) {
	tests := []struct {
		name  string
		src   string
		wants []want
	}{
		{"obsolete VDE paths", "paths:\n  vdeSwitch: /opt/vde/bin/vde_switch\n  vdeVMNet: /opt/vde/bin/vde_vmnet\nnetworks:\n  a:\n    mode: host\n    gateway: 10.0.0.1\n",
			[]want{{2, "paths.vdeSwitch", "VDE"}, {3, "paths.vdeVMNet", "VDE"}}},
		{"the same name in both sections", "networks:\n  shared:\n    mode: shared\n    gateway: 192.168.105.1\nvmnet:\n  shared:\n    subnet: 192.168.107.0/24\n",
			[]want{{2, "networks.shared", `"lima-shared"`}}},
		{"vmnet entry without subnet", "vmnet:\n  a: {}\n", []want{{2, "vmnet.a.subnet", "using 192.168.100.0/24"}}},
		{"DHCP keys on a bridged network", "networks:\n  br:\n    mode: bridged\n    interface: eth0\n    dhcp: false\n",
			[]want{{5, "networks.br.dhcp", "ignored"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nets, diags := LoadNetworks("networks.yaml", []byte(tt.src))
			if nets == nil {
				t.Fatalf("unexpected errors:\n%s", diagText(diags))
			}
			checkDiags(t, diags, SeverityWarning, tt.wants)
		})
	}
}

func TestLookupSections(t *testing.T) {
	nets := mustNetworks(t, `
networks:
  shared: {mode: shared, gateway: 192.168.105.1}
  host: {mode: host, gateway: 192.168.106.1}
vmnet:
  shared: {subnet: 192.168.107.0/24}
`)
	tests := []struct {
		kind RefKind
		name string
		want string
	}{
		{RefVMNet, "shared", "shared"},
		{RefLima, "shared", "lima-shared"},
		{RefVMNet, "host", "host"}, // falls back to the networks: map
		{RefLima, "host", "host"},
	}
	for _, tt := range tests {
		got := nets.Lookup(tt.kind, tt.name)
		if got == nil || got.ID != tt.want {
			t.Errorf("Lookup(%s, %s) = %v, want %s", tt.kind, tt.name, got, tt.want)
		}
	}
	if nets.Lookup(RefVMNet, "nope") != nil {
		t.Errorf("Lookup of an undefined name found something")
	}
}

func TestAutoSubnetSkipsTaken(t *testing.T) {
	nets := mustNetworks(t, "vmnet:\n  a:\n    subnet: 192.168.100.0/23\n  b: {}\n")
	if got := nets.Get("b").Subnet.String(); got != "192.168.102.0/24" {
		t.Errorf("auto subnet = %s, want 192.168.102.0/24", got)
	}
}

func TestHostModeTurnsNATOff(t *testing.T) {
	n := mustNetworks(t, "vmnet:\n  h:\n    mode: host\n    subnet: 10.1.0.0/24\n    nat44: true\n").Get("h")
	if n.NAT44 || n.NAT66 || !n.RouterAdvertisement {
		t.Errorf("host network has NAT44=%v NAT66=%v RA=%v, want no NAT and router advertisements (for SLAAC)", n.NAT44, n.NAT66, n.RouterAdvertisement)
	}
}

// lima's files as lima reads them: a vmnet entry with nothing under it is
// every default; a path vmnetctl does not know is a warning.
func TestLimaLeniency(t *testing.T) {
	nets, diags := LoadNetworks("n.yaml", []byte("vmnet:\n  shared:\n    # defaults\npaths:\n  vmnetHelper: /opt/vmnet-helper/bin/vmnet-helper\n  somethingNew: /x\n"))
	if diags.HasErrors() {
		t.Fatalf("errors: %v", diags.Err())
	}
	n := nets.Get("shared")
	if n == nil || n.Mode != ModeShared || !n.Subnet.IsValid() || !n.DHCP {
		t.Fatalf("shared with no keys: %+v", n)
	}
	found := false
	for _, d := range diags.Warnings() {
		found = found || (d.Field == "paths.somethingNew" && d.Line == 6)
	}
	if !found || nets.Paths.VMNetHelper != "/opt/vmnet-helper/bin/vmnet-helper" {
		t.Errorf("unknown path: warnings %v, vmnetHelper %q", diags.Warnings(), nets.Paths.VMNetHelper)
	}
}

func TestOnDemandNetwork(t *testing.T) {
	n, def, err := OnDemandNetwork(ModeShared, netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("10.96.0.50"), netip.MustParseAddr("255.255.255.0"))
	if err != nil {
		t.Fatal(err)
	}
	if n.Subnet.String() != "10.96.0.0/24" || n.Gateway.String() != "10.96.0.1" || n.DHCPStart.String() != "10.96.0.2" || n.DHCPEnd.String() != "10.96.0.50" || n.Mode != ModeShared {
		t.Errorf("on-demand network %+v from\n%s", n, def)
	}
	again, _, _ := OnDemandNetwork(ModeShared, netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("10.96.0.50"), netip.MustParseAddr("255.255.255.0"))
	other, _, _ := OnDemandNetwork(ModeHost, netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("10.96.0.50"), netip.MustParseAddr("255.255.255.0"))
	if again.ID != n.ID || other.ID == n.ID {
		t.Errorf("ids: %s, again %s, host mode %s", n.ID, again.ID, other.ID)
	}
	if _, _, err := OnDemandNetwork(ModeShared, netip.MustParseAddr("8.8.8.1"), netip.MustParseAddr("8.8.8.9"), netip.MustParseAddr("255.255.255.0")); err == nil {
		t.Errorf("a public subnet on demand: no error")
	}
}
