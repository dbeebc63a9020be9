package netplane

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/api"
)

// evpnNet is vxlanYAML's lab with EVPN in AS 65010.
func evpnNet(t *testing.T) *api.Network {
	t.Helper()
	nets, diags := api.LoadNetworks("networks.yaml", []byte(vxlanYAML+"      evpn: {asn: 65010}\n"))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
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
	conf := evpnConfig(n, local, peers, true)
	for _, want := range []string{"! " + Mark("lab") + ":", "router bgp 65010\n", " bgp router-id 10.77.0.1\n", " neighbor 10.77.0.2 peer-group " + pg + "\n",
		" neighbor 10.77.0.3 peer-group " + pg + "\n", "  neighbor " + pg + " activate\n  advertise-all-vni\n"} {
		if !strings.Contains(conf, want) {
			t.Errorf("FRR configuration lacks %q:\n%s", want, conf)
		}
	}
	if strings.Contains(evpnConfig(n, local, peers, false), "router-id") {
		t.Errorf("a router of the user's gets vmnetctl's router id")
	}
	routers := parseBGP(conf)
	if d := evpnDrift(routers, n, peers); len(d) != 0 {
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
	d := strings.Join(evpnDrift(parseBGP(running), n, peers), "; ")
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
	} {
		if err := evpnConflict(parseBGP(tc.running), n, local, peers); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("conflict with %q: %v, want %q", tc.running, err, tc.want)
		}
	}
}

// TestEVPNRemove: down of one of two EVPN networks of a state dir takes
// out of FRR only the neighbors the other does not have; down of the last
// takes out the router vmnetctl made; a router of the user's (no marker)
// loses only vmnetctl's peer-group and the advertise-all-vni vmnetctl
// added. FRR is a fake vtysh that shows a running configuration and
// records the rest.
func TestEVPNRemove(t *testing.T) {
	fake := t.TempDir()
	running, calls := filepath.Join(fake, "running"), filepath.Join(fake, "calls")
	script := "#!/bin/sh\ncase \"$*\" in *'show running-config'*) cat " + running + ";; *) echo \"$*\" >>" + calls + ";; esac\n"
	if err := os.WriteFile(filepath.Join(fake, "vtysh"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", fake+":"+os.Getenv("PATH"))
	pg := evpnPeerGroup()
	show := func(conf string) {
		os.Remove(calls)
		if err := os.WriteFile(running, []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	called := func() string { b, _ := os.ReadFile(calls); return strings.TrimSpace(string(b)) }
	state := t.TempDir()
	write := func(id, conf string) {
		os.MkdirAll(filepath.Join(state, "frr"), 0o755)
		if err := os.WriteFile(FRRConfigFile(state, id), []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	member := func(peers ...string) string {
		s := "router bgp 65010\n neighbor " + pg + " peer-group\n"
		for _, p := range peers {
			s += " neighbor " + p + " peer-group " + pg + "\n"
		}
		return s
	}
	// lab peers with .2 and .3, lab2 with .3 and .4; vmnetctl made the router.
	write("lab", member("10.77.0.2", "10.77.0.3")+"exit\n")
	write("lab2", member("10.77.0.3", "10.77.0.4")+"exit\n")
	os.WriteFile(routerMarker(filepath.Join(state, "frr"), 65010), nil, 0o644)
	show(member("10.77.0.2", "10.77.0.3", "10.77.0.4") + " address-family l2vpn evpn\n  advertise-all-vni\n exit-address-family\nexit\n")
	if err := removeEVPNOf(context.Background(), state, "lab"); err != nil {
		t.Fatal(err)
	}
	if got, want := called(), "-c configure terminal -c router bgp 65010 -c no neighbor 10.77.0.2"; got != want {
		t.Errorf("removing lab: vtysh %q, want %q", got, want)
	}
	show(member("10.77.0.3", "10.77.0.4") + "exit\n")
	if err := removeEVPNOf(context.Background(), state, "lab2"); err != nil {
		t.Fatal(err)
	}
	if got, want := called(), "-c configure terminal -c no router bgp 65010"; got != want {
		t.Errorf("removing lab2, the last: vtysh %q, want %q", got, want)
	}
	if files, _ := filepath.Glob(filepath.Join(state, "frr", "*")); len(files) != 0 {
		t.Errorf("left in the state dir: %v", files)
	}
	// The user's router, with a neighbor of its own: vmnetctl added
	// advertise-all-vni.
	write("lab", member("10.77.0.2")+"exit\n")
	os.WriteFile(advertiseMarker(filepath.Join(state, "frr"), 65010), nil, 0o644)
	show(member("10.77.0.2") + " neighbor 10.9.9.9 remote-as 65099\nexit\n")
	if err := removeEVPNOf(context.Background(), state, "lab"); err != nil {
		t.Fatal(err)
	}
	if got, want := called(), "-c configure terminal -c router bgp 65010 -c no neighbor 10.77.0.2 -c no neighbor "+pg+" peer-group -c address-family l2vpn evpn -c no advertise-all-vni -c exit-address-family"; got != want {
		t.Errorf("removing lab from the user's router: vtysh %q, want %q", got, want)
	}
	// Nothing of a network without an FRR file; FRR not asked.
	show("")
	if err := removeEVPNOf(context.Background(), state, "other"); err != nil || called() != "" {
		t.Errorf("removing a network without EVPN: %v, vtysh %q", err, called())
	}
}
