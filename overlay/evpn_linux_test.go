package overlay

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/overlay/overlaytest"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// evpnNet is overlaytest.VXLANYAML's lab with EVPN in AS 65010.
func evpnNet(t *testing.T) *api.Network {
	t.Helper()
	nets := testutil.LoadNetworks(t, overlaytest.VXLANYAML+"      evpn: {asn: 65010}\n")
	return nets.Get("lab")
}

// TestEVPNConfig: what vmnetctl writes FRR reads back (parseBGP, as FRR's
// running configuration shows it) as the segment with no drift; a router
// of another AS, another router id, or a neighbor of the user's for one of
// the hosts is a conflict named clearly; what is missing is drift.
func TestEVPNConfig(t *testing.T) {
	n := evpnNet(t)
	local := netip.MustParseAddr("10.77.0.1")
	peers := evpnPeers(n, 0)
	pg := evpnPeerGroup()
	conf := evpnConfig(n, local, peers, evpnMarks{router: true})
	for _, want := range []string{"! " + hostnet.Mark("lab") + ":", "router bgp 65010\n", " bgp router-id 10.77.0.1\n", " neighbor 10.77.0.2 peer-group " + pg + "\n",
		" neighbor 10.77.0.3 peer-group " + pg + "\n", "  neighbor " + pg + " activate\n  advertise-all-vni\n"} {
		if !strings.Contains(conf, want) {
			t.Errorf("FRR configuration lacks %q:\n%s", want, conf)
		}
	}
	if strings.Contains(evpnConfig(n, local, peers, evpnMarks{}), "router-id") {
		t.Errorf("a router of the user's gets vmnetctl's router id")
	}
	routers := parseBGP(conf)
	if d := evpnDrift(routers, n, peers, nil); len(d) != 0 {
		t.Errorf("drift of the configuration as written: %v", d)
	}
	if err := evpnConflict(routers, n, local, peers); err != nil {
		t.Errorf("conflict with itself: %v", err)
	}
	if asn, got := fileBGP(conf); asn != 65010 || len(got) != 2 {
		t.Errorf("read back AS %d peers %v, want 65010 and 2 peers", asn, got)
	}
	// As FRR shows it, with a user's neighbor and a VRF's router.
	running := "frr version 8.4.4\n!\nrouter bgp 65010\n bgp router-id 10.77.0.1\n neighbor " + pg + " peer-group\n neighbor " + pg + " remote-as internal\n" +
		" neighbor 10.77.0.2 peer-group " + pg + "\n neighbor 10.9.9.9 remote-as 65099\n !\n address-family l2vpn evpn\n  neighbor " + pg + " activate\n" +
		" exit-address-family\nexit\n!\nrouter bgp 65010 vrf blue\n neighbor 10.77.0.3 remote-as 1\nexit\n"
	d := strings.Join(evpnDrift(parseBGP(running), n, peers, nil), "; ")
	if !strings.Contains(d, "no neighbor 10.77.0.3 in "+pg) || !strings.Contains(d, "advertise-all-vni") || strings.Contains(d, "10.77.0.2") {
		t.Errorf("drift %q, want 10.77.0.3 and advertise-all-vni missing", d)
	}
	if r := parseBGP(running)[65010]; r.neighbors["10.9.9.9"] != "" || r.neighbors["10.77.0.2"] != pg {
		t.Errorf("parsed %+v", r)
	}
	for _, tc := range []struct{ running, want string }{
		{"router bgp 65001\nexit\n", "FRR runs BGP as AS 65001, and networks.yaml's vxlan.evpn.asn is 65010"},
		{"router bgp 65010\n bgp router-id 10.0.0.9\nexit\n", "router id 10.0.0.9, not this host's underlay address 10.77.0.1"},
		{"router bgp 65010\n neighbor 10.77.0.3 remote-as 65010\nexit\n", "already has the neighbor 10.77.0.3, configured outside vmnetctl"},
		{"router bgp 65010\n neighbor 10.9.9.9 remote-as 65099\n address-family l2vpn evpn\n  neighbor 10.9.9.9 activate\n exit-address-family\nexit\n",
			"has 10.9.9.9 active for l2vpn evpn, outside vmnetctl: advertise-all-vni would announce the segment's VNI 4242 to it"},
	} {
		if err := evpnConflict(parseBGP(tc.running), n, local, peers); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("conflict with %q: %v, want %q", tc.running, err, tc.want)
		}
	}
}
