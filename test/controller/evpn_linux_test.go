package controller_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/doctor"
	"github.com/vmnetctl/vmnetctl/statedir"
	"github.com/vmnetctl/vmnetctl/test/simvm"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// vtysh runs the commands on host h's FRR.
func vtysh(h *testutil.NS, cmds ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	args := []string{"-N", h.Name}
	for _, c := range cmds {
		args = append(args, "-c", c)
	}
	out, err := h.Command(ctx, "vtysh", args...).Output()
	return string(out), err
}

// TestEVPN runs multiHostLab's three hosts with EVPN: each host runs its
// own FRR; vmnetctl gives it the BGP sessions to the other two, and FRR,
// not vmnetctl, fills the tunnel's forwarding table (the remote VMs' MACs
// are extern_learn entries, the device does not learn). Status and the
// metrics count the established sessions; `down` takes vmnetctl's BGP
// configuration out of FRR and leaves a router of the user's alone; and
// FRR restarted (its configuration lost) gets it back from a check.
func TestEVPN(t *testing.T) {
	t.Parallel()
	var frrs []*testutil.FRR
	prepare := func(i int, h *simvm.Host) {
		frrs = append(frrs, testutil.StartFRR(t, h.NS))
		switch i {
		case 1:
			h.Env = append(h.Env, "VMNETCTL_RESYNC=1s") // for the drift below
		case 2:
			// Host 3's FRR has a BGP router of the user's, in the
			// segment's AS, with a neighbor of its own.
			if out, err := vtysh(h.NS, "configure terminal", "router bgp 65010", "neighbor 10.78.0.100 remote-as 65099"); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
		}
	}
	check := func(i int, hosts []*hostVM, metrics string) {
		x := hosts[i]
		// Status and the metrics show the sessions as last read (at most
		// 2 s before).
		testutil.Eventually(t, 10*time.Second, func() error {
			for _, n := range x.h.Status().Networks {
				if n.Name == "lab" && (n.Tunnel == nil || n.Tunnel.BGPEstablished() != 2) {
					return fmt.Errorf("lab's tunnel %+v, want 2 BGP sessions established", n.Tunnel)
				}
			}
			if !regexp.MustCompile(`(?m)^vmnetctl_network_tunnel_bgp_established\{network="lab"\} 2$`).MatchString(metrics) {
				resp, err := x.h.HTTPClient().Get("http://" + ctlapi.DefaultMetricsAddr + "/metrics")
				if err != nil {
					return err
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if metrics = string(b); !regexp.MustCompile(`(?m)^vmnetctl_network_tunnel_bgp_established\{network="lab"\} 2$`).MatchString(metrics) {
					return fmt.Errorf("the metrics lack 2 established BGP sessions:\n%s", testutil.Lines(metrics, "tunnel"))
				}
			}
			return nil
		}, "host %d's status and metrics to show 2 established BGP sessions", i+1)
		// FRR's entries: the other VMs' MACs learned through BGP
		// (extern_learn) behind their hosts; the device learns nothing.
		fdb := x.h.MustRun(t, "bridge", "fdb", "show", "dev", "vmx-lab")
		for j, y := range hosts {
			want := regexp.MustCompile(`(?m)^` + strings.ToLower(y.vm.MAC) + ` dst 10\.78\.0\.` + fmt.Sprint(j+1) + ` .*extern_learn`)
			if j != i && !want.MatchString(fdb) {
				t.Errorf("host %d: no entry of FRR's (extern_learn) for host %d's VM %s behind 10.78.0.%d:\n%s", i+1, j+1, y.vm.MAC, j+1, fdb)
			}
		}
		if link := x.h.MustRun(t, "ip", "-d", "link", "show", "vmx-lab"); !strings.Contains(link, "nolearning") {
			t.Errorf("host %d: the tunnel learns:\n%s", i+1, link)
		}
	}
	hosts := multiHostLab(t, "ev", multiHostNetworks("      evpn: {asn: 65010}\n"), prepare, check)

	// Host 2's bgpd restarts and has lost its configuration: the
	// controller's check finds it gone and gives it back, without
	// restarting the network (nor for FRR stopped, below).
	restarts := func() int {
		b, _ := os.ReadFile(statedir.Dir{Path: hosts[1].h.StateDir()}.ControllerLog())
		return strings.Count(string(b), "network changed behind vmnetctl's back")
	}
	before := restarts()
	frrs[1].Restart(t, "bgpd")
	testutil.Eventually(t, 30*time.Second, func() error {
		for _, n := range hosts[1].h.Status().Networks {
			if n.Name == "lab" && n.Tunnel != nil && n.Tunnel.BGPEstablished() == 2 {
				return nil
			}
		}
		return fmt.Errorf("host 2's sessions are not back")
	}, "host 2's FRR to get its BGP configuration back")
	testutil.Eventually(t, 10*time.Second, func() error { return hosts[0].vm.Ping(hosts[1].ip, 1) }, "host 1's VM to reach host 2's after host 2's FRR restarted")
	// doctor sees the sessions, and host 2 down as a session not up.
	doctorEVPN := func(h *simvm.Host) doctor.Finding {
		out, _ := h.Vmnetctl("doctor", "--json")
		return finding(doctorReport(t, []byte(out)), "EVPN of lab")
	}
	if f := doctorEVPN(hosts[0].h); f.Status != doctor.OK || !strings.HasPrefix(f.Detail, "2 of 2 BGP sessions established") {
		t.Errorf("doctor on host 1: %+v, want 2 of 2 sessions established", f)
	}
	// FRR not answering is not drift: host 2's network runs on (its VM
	// renews its lease), degraded with the reason, until FRR is back.
	frrs[1].Stop(t, "bgpd")
	testutil.Eventually(t, 15*time.Second, func() error {
		for _, n := range hosts[1].h.Status().Networks {
			if n.Name == "lab" && (n.State != "degraded" || !strings.Contains(n.Error, "bgpd is not running")) {
				return fmt.Errorf("host 2's lab is %s (%s)", n.State, n.Error)
			}
		}
		return nil
	}, "host 2's lab degraded by its FRR's bgpd stopped")
	if ip := hosts[1].vm.DHCP(t)["ip"]; ip != hosts[1].ip {
		t.Errorf("host 2's VM renewed its lease as %q, want %s", ip, hosts[1].ip)
	}
	if n := restarts() - before; n > 0 {
		t.Errorf("host 2's controller restarted lab %d times for its FRR's bgpd stopped", n)
	}
	testutil.Eventually(t, 15*time.Second, func() error {
		if f := doctorEVPN(hosts[0].h); f.Status != doctor.Warn || !strings.Contains(f.Detail, "not with h2 (10.78.0.2)") {
			return fmt.Errorf("doctor on host 1 with host 2's bgpd stopped: %+v", f)
		}
		return nil
	}, "doctor to see host 2's session down")
	frrs[1].Start(t, "bgpd")
	testutil.Eventually(t, 30*time.Second, func() error {
		if f := doctorEVPN(hosts[0].h); f.Status != doctor.OK {
			return fmt.Errorf("doctor on host 1: %+v", f)
		}
		return nil
	}, "host 2's session back")

	// down takes out what vmnetctl gave FRR, and only that: host 1's
	// router was vmnetctl's, host 3's the user's, which keeps its
	// neighbor and loses vmnetctl's sessions and advertise-all-vni.
	for _, i := range []int{0, 2} {
		hosts[i].h.MustVmnetctl("down", "-f", hosts[i].vms)
		hosts[i].h.MustVmnetctl("down", "-f", hosts[i].vms)
	}
	// Host 2 is alone: its sessions are down, and FRR took its flooding
	// entries away. That is FRR's to do, not drift: the controller, which
	// checks every second, keeps the network up.
	testutil.Eventually(t, 15*time.Second, func() error {
		if fdb := hosts[1].h.MustRun(t, "bridge", "fdb", "show", "dev", "vmx-lab"); strings.Contains(fdb, "00:00:00:00:00:00") {
			return fmt.Errorf("host 2 still floods:\n%s", fdb)
		}
		return nil
	}, "FRR to withdraw host 2's flooding entries")
	// Sampled (Poll's interval) for 3 s, three of host 2's checks: a
	// state other than up ends it at once.
	errUp := errors.New("still up")
	if err := testutil.Poll(3*time.Second, func() error {
		for _, n := range hosts[1].h.Status().Networks {
			if n.Name == "lab" && n.State != "up" {
				return testutil.Permanent(fmt.Errorf("host 2's lab is %s (%s) with FRR's entries gone, want up", n.State, n.Error))
			}
		}
		return errUp
	}); !errors.Is(err, errUp) {
		t.Fatal(err)
	}
	if conf, err := vtysh(hosts[0].h.NS, "show running-config"); err != nil || strings.Contains(conf, "router bgp") {
		t.Errorf("host 1's FRR after down (%v), want no router bgp:\n%s", err, conf)
	}
	conf, err := vtysh(hosts[2].h.NS, "show running-config")
	if err != nil || !strings.Contains(conf, "router bgp 65010\n") || !strings.Contains(conf, "neighbor 10.78.0.100 remote-as 65099") ||
		strings.Contains(conf, "vmnetctl") || strings.Contains(conf, "neighbor 10.78.0.1 ") || strings.Contains(conf, "advertise-all-vni") {
		t.Errorf("host 3's FRR after down (%v), want the user's router and neighbor alone:\n%s", err, conf)
	}
	if files, _ := filepath.Glob(filepath.Join(hosts[2].h.StateDir(), "frr", "*")); len(files) > 0 {
		t.Errorf("host 3's state dir keeps %v after down", files)
	}
}
