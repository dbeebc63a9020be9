package helper

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/api"
)

const testNetworks = `
networks:
  user-v2: {mode: user-v2, gateway: 192.168.104.1, netmask: 255.255.255.0}
  shared: {mode: shared, gateway: 192.168.105.1, dhcpEnd: 192.168.105.254, netmask: 255.255.255.0}
  host: {mode: host, gateway: 192.168.106.1, dhcpEnd: 192.168.106.254, netmask: 255.255.255.0}
  lab: {mode: host, gateway: 192.168.107.1, dhcpEnd: 192.168.107.100, netmask: 255.255.255.0}
  lan: {mode: bridged, interface: br0}
`

func TestResolveNetwork(t *testing.T) {
	nets, diags := api.LoadNetworks("test.yaml", []byte(testNetworks))
	if nets == nil {
		t.Fatal(diags)
	}
	onlyLab, _ := api.LoadNetworks("lab.yaml", []byte("networks:\n  lab: {mode: host, gateway: 192.168.107.1, dhcpEnd: 192.168.107.100, netmask: 255.255.255.0}\n"))
	tests := []struct {
		name    string
		nets    *api.Networks
		id      string
		m       ModeFlags
		want    string
		wantErr string
	}{
		{name: "by id", id: "lab", want: "lab"},
		{name: "unknown id", id: "nope", wantErr: `network "nope" is not defined in test.yaml (defined: host, lab, lan, shared)`},
		{name: "user-v2 id", id: "user-v2", wantErr: "does not manage"},
		{name: "id and mode", id: "lab", m: ModeFlags{OperationMode: "host"}, wantErr: "--network excludes"},
		{name: "default is shared", want: "shared"},
		{name: "host named like the mode", m: ModeFlags{OperationMode: "host"}, want: "host"},
		{name: "the only host network", nets: onlyLab, m: ModeFlags{OperationMode: "host"}, want: "lab"},
		{name: "no shared network", nets: onlyLab, wantErr: "defines no shared network"},
		{name: "matching addresses", m: ModeFlags{OperationMode: "shared", StartAddress: "192.168.105.1", EndAddress: "192.168.105.254", SubnetMask: "255.255.255.0"}, want: "shared"},
		{name: "other addresses", m: ModeFlags{StartAddress: "192.168.105.1", EndAddress: "192.168.105.100", SubnetMask: "255.255.255.0"}, wantErr: `do not match network "shared"`},
		{name: "partial addresses", m: ModeFlags{StartAddress: "192.168.105.1"}, wantErr: "must be given together"},
		{name: "bad address", m: ModeFlags{StartAddress: "x", EndAddress: "192.168.105.254", SubnetMask: "255.255.255.0"}, wantErr: `--start-address "x" is not an IPv4 address`},
		{name: "bridged", m: ModeFlags{OperationMode: "bridged", SharedInterface: "br0"}, want: "lan"},
		{name: "bridged other interface", m: ModeFlags{OperationMode: "bridged", SharedInterface: "eth1"}, wantErr: `no bridged network on interface "eth1"`},
		{name: "bridged without interface", m: ModeFlags{OperationMode: "bridged"}, wantErr: "requires --shared-interface"},
		{name: "shared interface without bridged", m: ModeFlags{SharedInterface: "br0"}, wantErr: "only for --operation-mode bridged"},
		{name: "unknown mode", m: ModeFlags{OperationMode: "nat"}, wantErr: `unknown --operation-mode "nat"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := tt.nets
			if ns == nil {
				ns = nets
			}
			n, err := ResolveNetwork(ns, tt.id, tt.m)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ResolveNetwork() error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ResolveNetwork() error = %v", err)
			}
			if n.ID != tt.want {
				t.Errorf("ResolveNetwork() = %s, want %s", n.ID, tt.want)
			}
		})
	}
}

func TestSizes(t *testing.T) {
	n := &api.Network{MTU: 9000, Subnet: netip.MustParsePrefix("10.0.0.0/22")}
	o := Options{Network: n}
	if o.MaxPacketSize() != 9014 {
		t.Errorf("MaxPacketSize = %d", o.MaxPacketSize())
	}
	o.TSO = true
	if o.MaxPacketSize() != 65550 || !o.Offloads() {
		t.Errorf("with TSO: %d, %v", o.MaxPacketSize(), o.Offloads())
	}
}
