package doctor

import (
	"context"
	"testing"

	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestDoctorEVPNNotAHost: on a host that is none of the segment's, doctor
// says nothing of EVPN (checkVXLAN names the problem), not "-1 of 2".
func TestDoctorEVPNNotAHost(t *testing.T) {
	nets := loadNets(t, "networks:\n  lab:\n    mode: shared\n    gateway: 10.95.0.1\n    netmask: 255.255.255.0\n"+
		"    vxlan: {vni: 7, hosts: [{name: a, address: 10.77.9.1}, {name: b, address: 10.77.9.2}], evpn: {asn: 65010}}\n")
	ns := testutil.NewNS(t, "docev")
	var got []Finding
	if err := ns.Do(func() error { got = checkEVPN(context.Background(), nets); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 0 {
		t.Errorf("doctor on no host of the segment: %+v, want no EVPN finding", got)
	}
}
