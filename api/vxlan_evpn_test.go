package api

import "testing"

func TestEVPN(t *testing.T) {
	for _, tc := range []struct {
		name, evpn string
		want       *EVPN
	}{
		{"none", "", nil},
		{"asn", "      evpn: {asn: 4200000001}\n", &EVPN{ASN: 4200000001}},
		{"empty mapping", "      evpn: {}\n", &EVPN{ASN: DefaultEVPNASN}},
		{"null", "      evpn:\n", &EVPN{ASN: DefaultEVPNASN}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := mustNetworks(t, vxlanNet+tc.evpn).Get("lab")
			got := n.VXLAN.EVPN
			if (got == nil) != (tc.want == nil) || (got != nil && *got != *tc.want) {
				t.Errorf("evpn %+v, want %+v", got, tc.want)
			}
			if tc.want != nil && n.VXLAN.String() != "vni 120 port 4789 dnsPort 5380 underlayMTU 1500 hosts rack1=10.0.0.1,rack2=10.0.0.2,rack3=10.0.0.3 "+tc.want.String() {
				t.Errorf("plan shows %q", n.VXLAN.String())
			}
		})
	}
}

func TestEVPNErrors(t *testing.T) {
	const head = "networks:\n  lab:\n    mode: shared\n    gateway: 10.9.0.1\n    netmask: 255.255.255.0\n    vxlan:\n      vni: 5\n      hosts: [{name: a, address: 10.0.0.1}, {name: b, address: 10.0.0.2}]\n"
	tests := []struct {
		name  string
		src   string
		wants []want
	}{
		{"asn zero", head + "      evpn: {asn: 0}\n", []want{{9, "networks.lab.vxlan.evpn.asn", "0 is not a BGP AS number"}}},
		{"asn too large", head + "      evpn: {asn: 4294967296}\n", []want{{9, "networks.lab.vxlan.evpn.asn", "not a BGP AS number"}}},
		{"AS_TRANS", head + "      evpn: {asn: 23456}\n", []want{{9, "networks.lab.vxlan.evpn.asn", "not 23456"}}},
		{"asn not a number", head + "      evpn: {asn: private}\n", []want{{9, "networks.lab.vxlan.evpn.asn", "must be a whole number"}}},
		{"unknown key", head + "      evpn: {asn: 65001, routeReflector: 10.0.0.9}\n", []want{{9, "networks.lab.vxlan.evpn.routeReflector", "unknown field"}}},
		{"not a mapping", head + "      evpn: true\n", []want{{9, "networks.lab.vxlan.evpn", "mapping"}}},
		{"two ASes", head + "      evpn: {asn: 65001}\n" +
			"  lab2:\n    mode: host\n    gateway: 10.8.0.1\n    netmask: 255.255.255.0\n    vxlan: {vni: 6, hosts: [{name: a, address: 10.0.0.1}], evpn: {asn: 65002}}\n",
			[]want{{10, "networks.lab2.vxlan.evpn.asn", `AS 65002 differs from network "lab"'s AS 65001`}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nets, diags := LoadNetworks("networks.yaml", []byte(tt.src))
			if nets != nil {
				t.Errorf("got networks, want nil on error")
			}
			checkDiags(t, diags, SeverityError, tt.wants)
		})
	}
}
