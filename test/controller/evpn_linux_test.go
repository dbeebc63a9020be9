package controller_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/doctor"
	"github.com/vmnetctl/vmnetctl/test/simvm"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// frrDaemons is where Debian's frr package keeps zebra and bgpd.
const frrDaemons = "/usr/lib/frr"

// startFRR runs FRR's zebra and bgpd in host h's namespace, as FRR's own
// convention for a namespace has it (frrinit.sh start NS): the
// namespace's name as their pathspace (-N), so their sockets are in
// /var/run/frr/NAME, where `vtysh -N NAME` finds them. Their
// configuration starts empty (vmnetctl gives them theirs); they are
// killed, and their run dir removed, when the test ends.
func startFRR(t *testing.T, h *testutil.NS) *frr {
	t.Helper()
	for _, d := range []string{"zebra", "bgpd"} {
		if _, err := os.Stat(filepath.Join(frrDaemons, d)); err != nil {
			testutil.Missing(t, "FRR's "+d, "apt-get install frr")
		}
	}
	testutil.RequireCommands(t, "vtysh")
	// The daemons drop to the frr user, which owns their run dir.
	frrUser, err := user.Lookup("frr")
	if err != nil {
		testutil.Missing(t, "the frr user", "apt-get install frr")
	}
	uid, _ := strconv.Atoi(frrUser.Uid)
	gid, _ := strconv.Atoi(frrUser.Gid)
	run := filepath.Join("/var/run/frr", h.Name)
	if err := os.MkdirAll(run, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(run, uid, gid); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(run) }) // after the daemons are killed
	dir := t.TempDir()
	f := &frr{ns: h, run: run, dir: dir, daemons: map[string]*exec.Cmd{}}
	f.start(t, "zebra")
	// bgpd that finds no zebra tries again 10 s later.
	testutil.Eventually(t, 10*time.Second, func() error {
		_, err := os.Stat(filepath.Join(run, "zserv.api"))
		return err
	}, "zebra in %s to listen", h.Name)
	f.start(t, "bgpd")
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
			for _, l := range logs {
				b, _ := os.ReadFile(l)
				t.Logf("%s's %s:\n%s", h.Name, filepath.Base(l), tail(string(b), 30))
			}
		}
	})
	testutil.Eventually(t, 10*time.Second, func() error {
		_, err := vtysh(h, "show bgp summary")
		return err
	}, "FRR in %s to answer", h.Name)
	return f
}

// frr is one namespace's FRR.
type frr struct {
	ns       *testutil.NS
	run, dir string
	daemons  map[string]*exec.Cmd
}

// start starts FRR's daemon d (zebra, bgpd) with an empty configuration,
// its output in the test's dir.
func (f *frr) start(t *testing.T, d string) {
	f.daemons[d] = f.ns.Start(t, filepath.Join(f.dir, fmt.Sprintf("%s-%d.log", d, time.Now().UnixNano())), filepath.Join(frrDaemons, d), "-N", f.ns.Name, "-f", "/dev/null",
		"-i", filepath.Join(f.run, d+".pid"), "-P", "0", "--log", "stdout")
}

// restart kills daemon d and starts it again: it has lost what it was told.
func (f *frr) restart(t *testing.T, d string) {
	f.stop(t, d)
	f.start(t, d)
}

// stop kills daemon d.
func (f *frr) stop(t *testing.T, d string) {
	pid := f.daemons[d].Process.Pid
	f.daemons[d].Process.Kill()
	testutil.Eventually(t, 5*time.Second, func() error {
		if syscall.Kill(pid, 0) == nil {
			return fmt.Errorf("%s (pid %d) still runs", d, pid)
		}
		return nil
	}, "%s to end", d)
}

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

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
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
	var frrs []*frr
	prepare := func(i int, h *simvm.Host) {
		frrs = append(frrs, startFRR(t, h.NS))
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
		for _, n := range x.h.Status().Networks {
			if n.Name == "lab" && (n.Tunnel == nil || n.Tunnel.BGPEstablished() != 2) {
				t.Errorf("host %d: lab's tunnel %+v, want 2 BGP sessions established", i+1, n.Tunnel)
			}
		}
		if !regexp.MustCompile(`(?m)^vmnetctl_network_tunnel_bgp_established\{network="lab"\} 2$`).MatchString(metrics) {
			t.Errorf("host %d's metrics lack 2 established BGP sessions:\n%s", i+1, testutil.Lines(metrics, "tunnel"))
		}
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
	// controller's check finds it gone and gives it back.
	frrs[1].restart(t, "bgpd")
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
	frrs[1].stop(t, "bgpd")
	testutil.Eventually(t, 15*time.Second, func() error {
		if f := doctorEVPN(hosts[0].h); f.Status != doctor.Warn || !strings.Contains(f.Detail, "not with h2 (10.78.0.2)") {
			return fmt.Errorf("doctor on host 1 with host 2's bgpd stopped: %+v", f)
		}
		return nil
	}, "doctor to see host 2's session down")
	frrs[1].start(t, "bgpd")
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
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		for _, n := range hosts[1].h.Status().Networks {
			if n.Name == "lab" && n.State != "up" {
				t.Fatalf("host 2's lab is %s (%s) with FRR's entries gone, want up", n.State, n.Error)
			}
		}
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
