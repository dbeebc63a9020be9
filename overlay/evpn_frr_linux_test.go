package overlay

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/nettypes"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// These tests run vmnetctl's FRR part against the real FRR (zebra and
// bgpd in a namespace of the test's, testutil.StartFRR): what FRR takes,
// refuses and shows is the point. Host 10.77.0.1 is this one.

// frrLab is a namespace with FRR running, for one test.
type frrLab struct {
	t   *testing.T
	ns  *testutil.NS
	frr *testutil.FRR
}

func newFRRLab(t *testing.T) *frrLab {
	ns := testutil.NewNS(t, "evfrr")
	l := &frrLab{t: t, ns: ns, frr: testutil.StartFRR(t, ns)}
	t.Cleanup(func() { hostnet.SetOwner("") })
	return l
}

// evpnNetOf is network id of EVPN in AS 65010 with hosts 10.77.0.1 (this
// one) and the others given by their last byte.
func evpnNetOf(t *testing.T, id string, others ...int) *api.Network {
	t.Helper()
	y := "networks:\n  " + id + ":\n    mode: shared\n    gateway: 10.200.50.1\n    dhcpEnd: 10.200.50.100\n    netmask: 255.255.255.0\n" +
		"    vxlan:\n      vni: 4242\n      hosts:\n        - {name: h1, address: 10.77.0.1}\n"
	for _, o := range others {
		y += fmt.Sprintf("        - {name: h%d, address: 10.77.0.%d}\n", o, o)
	}
	nets := testutil.LoadNetworks(t, y+"      evpn: {asn: 65010}\n")
	return nets.Get(id)
}

// ensure gives FRR network n as state dir state's (its owner).
func (l *frrLab) ensure(state string, n *api.Network) error {
	hostnet.SetOwner(state)
	return l.ns.Do(func() error {
		return ensureFRR(context.Background(), n, 0, netip.MustParseAddr("10.77.0.1"), state)
	})
}

// remove takes network id of state dir state out of FRR.
func (l *frrLab) remove(state, id string) error {
	hostnet.SetOwner(state)
	return l.ns.Do(func() error { return removeEVPNOf(context.Background(), state, id) })
}

func (l *frrLab) running() string {
	l.t.Helper()
	out, err := l.frr.Vtysh("show running-config")
	if err != nil {
		l.t.Fatal(err)
	}
	return out
}

// router is FRR's router bgp 65010 block ("" none).
func (l *frrLab) router() string {
	l.t.Helper()
	conf := l.running()
	i := strings.Index(conf, "router bgp 65010\n")
	if i < 0 {
		return ""
	}
	return conf[i : i+strings.Index(conf[i:], "\nexit\n")+6]
}

func mustNil(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// TestEVPNRemoveFRR: down of one of two EVPN networks of a state dir
// takes out only the neighbors the other does not have; the last takes out
// the router vmnetctl made; a router of the user's loses only vmnetctl's
// group and the advertise-all-vni vmnetctl added, and one FRR restarted
// (that has only the user's router back, from its frr.conf) nothing:
// down does not fail on what FRR no longer has.
func TestEVPNRemoveFRR(t *testing.T) {
	l := newFRRLab(t)
	state := t.TempDir()
	lab, lab2 := evpnNetOf(t, "lab", 2, 3), evpnNetOf(t, "lab2", 3, 4)
	mustNil(t, "up lab", l.ensure(state, lab))
	mustNil(t, "up lab2", l.ensure(state, lab2))
	pg := evpnPeerGroup()
	r := l.router()
	for _, want := range []string{"bgp router-id 10.77.0.1", "neighbor 10.77.0.2 peer-group " + pg, "neighbor 10.77.0.4 peer-group " + pg, "advertise-all-vni", markRouter} {
		if !strings.Contains(r, want) {
			t.Errorf("FRR's router after up lacks %q:\n%s", want, r)
		}
	}
	mustNil(t, "down lab", l.remove(state, "lab"))
	if r := l.router(); strings.Contains(r, "10.77.0.2 ") || !strings.Contains(r, "10.77.0.3 peer-group") || !strings.Contains(r, "10.77.0.4 peer-group") {
		t.Errorf("after lab's down, want 10.77.0.2 gone and lab2's neighbors kept:\n%s", r)
	}
	// A marker file of the vmnetctl before the marks moved into FRR.
	if err := os.WriteFile(filepath.Join(state, "frr", "router-bgp-65010.made"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	mustNil(t, "down lab2", l.remove(state, "lab2"))
	if r := l.router(); r != "" {
		t.Errorf("the router vmnetctl made is left after the last down:\n%s", r)
	}
	if files, _ := filepath.Glob(filepath.Join(state, "frr", "*")); len(files) != 0 {
		t.Errorf("left in the state dir: %v", files)
	}

	// The user's router, with a neighbor of its own.
	user := "router bgp 65010\n neighbor 10.9.9.9 remote-as 65099\nexit\n"
	l.frr.Apply(t, user)
	mustNil(t, "up lab on the user's router", l.ensure(state, lab))
	if r := l.router(); !strings.Contains(r, markAdvertise) || strings.Contains(r, markRouter) || strings.Contains(r, "router-id") {
		t.Errorf("vmnetctl on the user's router: want advertise-all-vni marked as added, no router id:\n%s", r)
	}
	mustNil(t, "down lab", l.remove(state, "lab"))
	if r := l.router(); strings.Contains(r, "vmnetctl") || strings.Contains(r, "advertise-all-vni") || !strings.Contains(r, "neighbor 10.9.9.9 remote-as 65099") {
		t.Errorf("the user's router after down, want its neighbor alone:\n%s", r)
	}

	// FRR restarted: it has the user's router (from its frr.conf), none
	// of vmnetctl's configuration.
	mustNil(t, "up lab on the user's router", l.ensure(state, lab))
	l.frr.Restart(t, "bgpd")
	l.frr.Apply(t, user)
	for i := range 2 {
		if err := l.remove(state, "lab"); err != nil {
			t.Fatalf("down %d after FRR restarted: %v", i+1, err)
		}
	}
	if _, err := os.Stat(FRRConfigFile(state, "lab")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("lab's FRR file after down: %v", err)
	}
	if r := l.router(); !strings.Contains(r, "neighbor 10.9.9.9 remote-as 65099") {
		t.Errorf("the user's router after down:\n%s", r)
	}
}

// TestEVPNRemoveKeepsUsersAdditions: the router vmnetctl made, which the
// user added to, is not removed with vmnetctl's last segment: only
// vmnetctl's lines go.
func TestEVPNRemoveKeepsUsersAdditions(t *testing.T) {
	l := newFRRLab(t)
	lab := evpnNetOf(t, "lab", 2, 3)
	for _, tc := range []struct{ name, user, want string }{
		{"network", " address-family ipv4 unicast\n  network 192.0.2.0/24\n exit-address-family\n", "network 192.0.2.0/24"},
		{"unnumbered neighbor", " neighbor lo interface remote-as external\n", "neighbor lo interface"},
		{"vni", " address-family l2vpn evpn\n  vni 999\n   rd 1.1.1.1:999\n  exit-vni\n exit-address-family\n", "vni 999"},
		{"a neighbor's option", " neighbor 10.77.0.2 password secret\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state := t.TempDir()
			mustNil(t, "up", l.ensure(state, lab))
			l.frr.Apply(t, "router bgp 65010\n"+tc.user+"exit\n")
			mustNil(t, "down", l.remove(state, "lab"))
			r := l.router()
			if tc.want == "" {
				if r == "" {
					return // the user's option went with vmnetctl's neighbor
				}
				t.Errorf("after down:\n%s", r)
			}
			if !strings.Contains(r, tc.want) {
				t.Errorf("the user's %q is gone after down:\n%s", tc.want, r)
			}
			if strings.Contains(r, "vmnetctl") || strings.Contains(r, "advertise-all-vni") || strings.Contains(r, "10.77.0.2") {
				t.Errorf("vmnetctl's lines are left after down:\n%s", r)
			}
			l.frr.Vtysh("configure terminal", "no router bgp 65010")
		})
	}
}

// TestEVPNTwoOwners: two state dirs on one FRR share what vmnetctl added:
// the router the first made stays while the second's group is in it, and
// goes with the second; advertise-all-vni too. A host that one state dir
// peers with is another's conflict, named as such.
func TestEVPNTwoOwners(t *testing.T) {
	l := newFRRLab(t)
	a, b := t.TempDir(), t.TempDir()
	mustNil(t, "up a", l.ensure(a, evpnNetOf(t, "lab", 2)))
	mustNil(t, "up b", l.ensure(b, evpnNetOf(t, "lab", 3)))
	hostnet.SetOwner(a)
	pgA := evpnPeerGroup()
	mustNil(t, "down a", l.remove(a, "lab"))
	r := l.router()
	if !strings.Contains(r, "advertise-all-vni") || !strings.Contains(r, "10.77.0.3 peer-group") || strings.Contains(r, pgA) {
		t.Errorf("after a's down, want b's group and advertise-all-vni kept, a's gone:\n%s", r)
	}
	mustNil(t, "down b", l.remove(b, "lab"))
	if r := l.router(); r != "" {
		t.Errorf("after both downs, a router nothing owns is left:\n%s", r)
	}

	mustNil(t, "up a", l.ensure(a, evpnNetOf(t, "lab", 2)))
	err := l.ensure(b, evpnNetOf(t, "lab", 2))
	if err == nil || !strings.Contains(err.Error(), "another vmnetctl state dir (peer-group "+pgA) || strings.Contains(err.Error(), "outside vmnetctl") {
		t.Errorf("b peering with a's host: %v, want it named a's", err)
	}
	mustNil(t, "down a", l.remove(a, "lab"))
}

// TestEVPNNoBGPD: with zebra alone, vtysh takes BGP's commands and applies
// none. The FRR part says bgpd is not running (an FRR that is not there)
// and writes nothing; the network's up does not fail on it (its services
// run without FRR) and its check reports FRR unreachable, not drift; down
// has nothing to take out.
func TestEVPNNoBGPD(t *testing.T) {
	l := newFRRLab(t)
	l.frr.Stop(t, "bgpd")
	state := t.TempDir()
	lab := evpnNetOf(t, "lab", 2)
	err := l.ensure(state, lab)
	if !errors.Is(err, errNoFRR) || !strings.Contains(err.Error(), "bgpd is not running") {
		t.Errorf("up without bgpd: %v, want bgpd is not running", err)
	}
	l.ns.MustRun(t, "ip", "link", "add", "vmn-lab", "type", "bridge")
	l.ns.MustRun(t, "ip", "link", "add", "vmx-lab", "master", "vmn-lab", "type", "vxlan", "id", "4242", "dstport", "4789", "nolearning")
	var checked []error
	l.ns.Do(func() error {
		vx, lerr := netlink.LinkByName("vmx-lab")
		if lerr != nil {
			return lerr
		}
		err = ensureEVPN(context.Background(), lab, vx, 0, netip.MustParseAddr("10.77.0.1"))
		checked = checkEVPN(context.Background(), lab, vx, 0)
		return nil
	})
	if err != nil {
		t.Errorf("the network's EVPN part without bgpd: %v, want nil (the network runs)", err)
	}
	var fe *nettypes.FRRError
	if len(checked) != 1 || !errors.As(checked[0], &fe) || !fe.Unreachable || !strings.Contains(fe.Error(), "bgpd is not running") {
		t.Errorf("check without bgpd: %v, want FRR unreachable", checked)
	}
	mustNil(t, "down", l.remove(state, "lab"))
	if files, _ := filepath.Glob(filepath.Join(state, "frr", "*")); len(files) != 0 {
		t.Errorf("left in the state dir: %v", files)
	}
}

// TestEVPNStrangers: a member of vmnetctl's peer-group that no network of
// the state dir has (left by a failed down, or added by hand) is drift,
// and up takes it out.
func TestEVPNStrangers(t *testing.T) {
	l := newFRRLab(t)
	state := t.TempDir()
	lab := evpnNetOf(t, "lab", 2)
	mustNil(t, "up", l.ensure(state, lab))
	pg := evpnPeerGroup()
	if out, err := l.frr.Vtysh("configure terminal", "router bgp 65010", "neighbor 10.77.0.9 peer-group "+pg); err != nil {
		t.Fatal(out, err)
	}
	members, _ := dirPeers(filepath.Join(state, "frr"), "")
	routers := parseBGP(l.running())
	if d := strings.Join(evpnDrift(routers, lab, evpnPeers(lab, 0), members), "; "); !strings.Contains(d, "10.77.0.9") {
		t.Errorf("drift %q, want the stranger 10.77.0.9", d)
	}
	mustNil(t, "up again", l.ensure(state, lab))
	if r := l.router(); strings.Contains(r, "10.77.0.9") || !strings.Contains(r, "10.77.0.2 peer-group") {
		t.Errorf("after up, want the stranger gone:\n%s", r)
	}
	mustNil(t, "down", l.remove(state, "lab"))
}

// TestEVPNSessionsCached: status and the metrics take the sessions from
// the latest read and never wait on FRR: with bgpd hung, they get the
// read from before at once, and FRR's error once a read fails.
func TestEVPNSessionsCached(t *testing.T) {
	l := newFRRLab(t)
	state := t.TempDir()
	lab := evpnNetOf(t, "lab", 2)
	mustNil(t, "up", l.ensure(state, lab))
	old := sessionMaxAge
	sessionMaxAge = 0 // every call reads again (in the background)
	t.Cleanup(func() { sessionMaxAge = old })
	read := func() (s map[string]string, took time.Duration, err error) {
		l.ns.Do(func() error {
			began := time.Now()
			s, err = cachedSessions(lab)
			took = time.Since(began)
			return nil
		})
		return s, took, err
	}
	if s, _, err := read(); err != nil || s["10.77.0.2"] == "" {
		t.Fatalf("first read: %v, %v; want 10.77.0.2's session (not established)", s, err)
	}
	l.frr.Signal(t, "bgpd", syscall.SIGSTOP)
	for range 3 {
		if s, took, err := read(); took > 500*time.Millisecond || err != nil || s["10.77.0.2"] == "" {
			t.Errorf("read with bgpd hung: %v, %v after %v; want the read from before at once", s, err, took)
		}
	}
	l.frr.Stop(t, "bgpd")
	testutil.Eventually(t, 25*time.Second, func() error {
		if _, _, err := read(); !errors.Is(err, errNoFRR) && !errors.Is(err, errFRRHung) {
			return fmt.Errorf("read with bgpd stopped: %v", err)
		}
		return nil
	}, "FRR's error in the cached read")
}
