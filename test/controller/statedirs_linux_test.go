package controller_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/hostnet"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/statedir"
	"github.com/vmnetctl/vmnetctl/test/simvm"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestTwoStateDirs runs two state dirs in one namespace: what one makes
// carries its identity, so the other's `down --all` leaves it alone, and a
// network of the same name in the other is a clear error, not a takeover.
// Their VM ports too: the same VM name in both (the same TAP name) is an
// error for the second, which leaves the first's TAP alone, and on a
// bridged network of the same name in both, each state dir's `down --all`
// deletes only its own macvtaps.
func TestTwoStateDirs(t *testing.T) {
	a := newHost(t)
	dir, err := os.MkdirTemp("", "vmnb") // short: socket paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// The LAN of the bridged network lan that both state dirs define: a
	// veth that is not a bridge, so each VM on it gets a macvtap.
	a.MustRun(t, "ip", "link", "add", "up0", "type", "veth", "peer", "name", "up0p")
	a.MustRun(t, "ip", "link", "set", "up0", "up")
	const lan = "networks:\n  lan:\n    mode: bridged\n    interface: up0\n"
	a.Networks = a.WriteFile("networks-a.yaml", networksYAML+lan)
	b := &simvm.Host{NS: a.NS, T: t, Dir: dir, Binary: a.Binary}
	b.Networks = b.WriteFile("networks.yaml", "vmnet:\n  lab:\n    subnet: 10.90.0.0/24\n"+lan)
	t.Cleanup(func() { exec.Command("pkill", "-9", "-f", "--", "--state-dir "+b.StateDir()).Run() })

	a.MustVmnetctl("up", "-f", a.WriteFile("vms.yaml", "vms:\n  a:\n    networks:\n      - vmnet: shared\n  m:\n    networks:\n      - vmnet: lan\n"))
	stA := a.Status()
	vm := a.VM(a.Attachment(stA, "a"))
	vm.DHCP(t)
	tapA, macvtapA := a.Attachment(stA, "a").Tap, a.Attachment(stA, "m").Tap
	if tapA == "" || macvtapA == "" {
		t.Fatalf("the first state dir's VM ports: TAP %q, macvtap %q", tapA, macvtapA)
	}
	// Both carry the first state dir's owner in their mark.
	for _, port := range []string{tapA, macvtapA} {
		if out := a.MustRun(t, "ip", "-o", "link", "show", port); !regexp.MustCompile(`alias vmnetctl:(tap=` + port + `|network=lan)@[0-9a-f]{8}`).MatchString(out) {
			t.Errorf("the first state dir's VM port %s is not marked with an owner: %s", port, out)
		}
	}
	// The second state dir: its own VM b, its VM n on lan, and a VM a of
	// the first one's name, whose TAP name is the first one's a's.
	_, err = b.Vmnetctl("up", "-f", b.WriteFile("vms.yaml", "vms:\n  b:\n    networks:\n      - vmnet: lab\n  n:\n    networks:\n      - vmnet: lan\n  a:\n    networks:\n      - vmnet: lab\n"))
	msg := fmt.Sprint(err)
	if stB, _ := b.ReadStatus(); stB != nil {
		for _, at := range stB.Attachments {
			msg += "\n" + at.VM + ": " + at.State + " " + at.Error
			if at.VM != "a" && at.State != "running" {
				t.Errorf("the second state dir's VM %s: %s (%s), want running", at.VM, at.State, at.Error)
			}
		}
	}
	t.Logf("the second state dir's up: %s", msg)
	if !strings.Contains(msg, "TAP "+tapA+" is a VM port of another vmnetctl state dir") {
		t.Errorf("up of a VM of the first state dir's VM name in the second: want an error naming the other state dir, got:\n%s", msg)
	}

	intact := func(when string) {
		t.Helper()
		for _, args := range [][]string{
			{"ip", "link", "show", "vmn-shared"},
			{"nft", "list", "table", "inet", hostnet.TableName("shared")},
			{"nft", "list", "table", "bridge", hostnet.TableName("shared")},
			{"ip", "link", "show", macvtapA},
		} {
			if _, err := a.Run(context.Background(), args[0], args[1:]...); err != nil {
				t.Errorf("%s: %s: %v", when, strings.Join(args, " "), err)
			}
		}
		if out, _ := a.Run(context.Background(), "ip", "-o", "link", "show", "master", "vmn-shared"); !strings.Contains(out, " "+tapA+":") {
			t.Errorf("%s: the first state dir's TAP %s is not a port of vmn-shared: %s", when, tapA, out)
		}
		if out := a.MustRun(t, "ip", "-4", "-o", "addr", "show", "dev", "vmn-shared"); !strings.Contains(out, gateway+"/24") {
			t.Errorf("%s: vmn-shared's address: %s", when, out)
		}
		if err := vm.Ping(gateway, 1); err != nil {
			t.Errorf("%s: the first state dir's VM cannot reach its gateway: %v", when, err)
		}
	}

	// The second state dir's down --all takes only its own.
	if out := b.MustVmnetctl("down", "--all"); !strings.Contains(out, "Everything is down") {
		t.Errorf("down --all of the second state dir:\n%s", out)
	}
	if _, err := a.Run(context.Background(), "ip", "link", "show", "vmn-lab"); err == nil {
		t.Errorf("the second state dir's bridge vmn-lab is still there")
	}
	intact("after the second state dir's down --all")

	// The same network name in the second state dir: refused, with a
	// reason, and the first one's network is untouched.
	b.Networks = b.WriteFile("networks.yaml", "vmnet:\n  shared:\n    subnet: 10.91.0.0/24\n")
	_, err = b.Vmnetctl("up", "-f", b.WriteFile("vms.yaml", "vms:\n  c:\n    networks:\n      - vmnet: shared\n"))
	st, _ := b.ReadStatus()
	msg = ""
	if err != nil {
		msg = err.Error()
	}
	if st != nil {
		for _, n := range st.Networks {
			msg += "\n" + n.Error
		}
	}
	if !strings.Contains(msg, "another vmnetctl state dir") {
		t.Errorf("up of a second state dir with the first one's network name: want an error naming the other state dir, got %v\n%s", err, msg)
	}
	intact("after the second state dir's conflicting up")
	b.Vmnetctl("down", "--all")
	intact("after the second state dir's last down --all")
}

// TestUpPreflight: without root, `up` stops at once with doctor's words and
// a fix, before it records or starts anything.
func TestUpPreflight(t *testing.T) {
	h := newHost(t)
	testutil.RequireCommands(t, "setpriv")
	vms := h.WriteFile("vms.yaml", twoVMs)
	os.Chmod(h.Dir, 0o755)
	args := append([]string{"--reuid", "65534", "--regid", "65534", "--clear-groups"}, h.VmnetctlArgs("up", "-f", vms)...)
	out, err := h.Run(context.Background(), "setpriv", args...)
	if err == nil || !strings.Contains(out, "not running as root") || !strings.Contains(out, "sudo") {
		t.Fatalf("up as nobody: %v\n%s", err, out)
	}
	if _, err := os.Stat(h.StateDir()); err == nil {
		t.Errorf("up as nobody made the state dir %s", h.StateDir())
	}
}

// TestServeStay: the controller as a service (`serve`, the packaged unit's
// command) serves `up`, and after `down --all` removes everything and
// stays, ready for the next `up`.
func TestServeStay(t *testing.T) {
	h := newHost(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := h.VmnetctlCommand(ctx, "serve", "--metrics-addr", "off")
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Process.Signal(syscall.SIGTERM); srv.Wait() }()
	running := func() error {
		st, err := h.ReadStatus()
		if err != nil {
			return err
		}
		if !st.Controller.Running || st.Controller.PID != srv.Process.Pid {
			return fmt.Errorf("controller %+v, want the service's pid %d running", st.Controller, srv.Process.Pid)
		}
		return nil
	}
	testutil.Eventually(t, 10*time.Second, running, "the service to answer")
	vms := h.WriteFile("vms.yaml", twoVMs)
	for round := range 2 {
		h.MustVmnetctl("up", "-f", vms)
		if st := h.Status(); len(st.Attachments) != 2 || st.Attachments[0].State != "running" {
			t.Fatalf("round %d: after up: %+v", round, st.Attachments)
		}
		if out := h.MustVmnetctl("down", "--all"); !strings.Contains(out, "Everything is down.") {
			t.Fatalf("round %d: down --all:\n%s", round, out)
		}
		if out, _ := h.Run(context.Background(), "ip", "-br", "link"); strings.Contains(out, "vmn-") {
			t.Fatalf("round %d: bridges left after down --all:\n%s", round, out)
		}
		if err := running(); err != nil {
			t.Fatalf("round %d: after down --all the service must stay: %v", round, err)
		}
	}
}

// TestDemoWithoutTools runs the demo's commands with a PATH that has no
// tool at all (no nft): what needs nothing works, and `up` stops at once
// with the one-line fix.
func TestDemoWithoutTools(t *testing.T) {
	h := newHost(t)
	h.Env = append(h.Env, "PATH="+t.TempDir())
	if out := h.MustVmnetctl("networks"); !strings.Contains(out, "shared") {
		t.Errorf("networks:\n%s", out)
	}
	vms := h.WriteFile("vms.yaml", twoVMs)
	h.MustVmnetctl("validate", "-f", vms)
	_, err := h.Vmnetctl("up", "-f", vms)
	if err == nil || !strings.Contains(err.Error(), "the nft command is not installed; install it: sudo apt install nftables") {
		t.Fatalf("up without nft: want the one-line fix, got %v", err)
	}
	if _, err := os.Stat(h.StateDir()); err == nil {
		t.Errorf("up without nft made the state dir %s", h.StateDir())
	}
}

// TestNetworksOfRecord: an `up` that names no networks.yaml uses the one
// the state dir's projects run with, so another project's networks (its
// reservations, its lease times) stay as they are.
func TestNetworksOfRecord(t *testing.T) {
	h := newHost(t)
	// A reservation for a, which must survive b's up.
	h.WriteFile(filepath.Base(h.Networks), strings.Replace(networksYAML, "    dhcpRange:",
		"    reservations:\n      \""+api.DeriveMAC("a", 0).String()+"\": 10.77.0.140\n    dhcpRange:", 1))
	a := h.WriteFile("a.yaml", "vms:\n  a:\n    networks:\n      - vmnet: shared\n")
	b := h.WriteFile("b.yaml", "vms:\n  b:\n    networks:\n      - vmnet: shared\n")
	h.MustVmnetctl("up", "-f", a) // names networksYAML (--networks)
	// Without --networks (and without $VMNETCTL_NETWORKS).
	cmd := h.NS.Command(context.Background(), h.Binary, "--state-dir", h.StateDir(), "up", "-f", b)
	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "VMNETCTL_NETWORKS=") {
			env = append(env, e)
		}
	}
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("up without --networks: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "using the networks of record") {
		t.Errorf("up without --networks does not say which networks it uses:\n%s", out)
	}
	snap, err := statedir.Dir{Path: h.StateDir()}.Networks()
	if err != nil || snap == nil || snap.Source != h.Networks {
		src := ""
		if snap != nil {
			src = snap.Source
		}
		t.Fatalf("networks of record after the second up: %q, %v; want %s", src, err, h.Networks)
	}
	// Both projects run on the networks of record: the shared network is
	// the one of networksYAML (10.77.0.0/24), not the built-in one.
	for _, n := range h.Status().Networks {
		if n.Name == "shared" && n.Subnet != "10.77.0.0/24" {
			t.Errorf("shared network: subnet %s, want 10.77.0.0/24 of the networks of record", n.Subnet)
		}
	}
	if out := h.MustVmnetctl("plan", "-f", a); strings.TrimSpace(out) != "No changes." {
		t.Errorf("plan of the first project after the second's up:\n%s", out)
	}
	if ip := h.VM(h.Attachment(h.Status(), "a")).DHCP(t)["ip"]; ip != "10.77.0.140" {
		t.Errorf("a leased %s after b's up, want its reservation 10.77.0.140", ip)
	}
	// Naming another networks.yaml, even with the same networks, is a
	// change plan shows.
	same := h.WriteFile("same-networks.yaml", networksYAML)
	args := []string{h.Binary, "--state-dir", h.StateDir(), "--networks", same, "plan", "-f", a}
	if out := h.MustRun(t, args[0], args[1:]...); !strings.Contains(out, "networks.yaml: "+h.Networks+" -> "+same) {
		t.Errorf("plan with another networks.yaml:\n%s", out)
	}
}

// TestStateDirSpellings: one state dir named two ways (through a symbolic
// link in its path, as /var/run is /run) is one state dir: `down --all`
// through the other spelling stops the helpers and removes the network
// that `up` made through the first, also when the controller that made
// them is gone (killed).
func TestStateDirSpellings(t *testing.T) {
	h := newHost(t)
	link := filepath.Join(h.Dir, "link")
	if err := os.Symlink(h.Dir, link); err != nil {
		t.Fatal(err)
	}
	vms := h.WriteFile("vms.yaml", "vms:\n  a:\n    networks:\n      - vmnet: shared\n")
	h.MustVmnetctl("up", "-f", vms)
	st := h.Status()
	pid := h.Attachment(st, "a").PID
	// Without its controller, the next one starts under the other
	// spelling and must know the network and the helper as its own.
	syscall.Kill(st.Controller.PID, syscall.SIGKILL)
	h.MustVmnetctl("down", "--all", "--state-dir", filepath.Join(link, "state"))
	testutil.Eventually(t, 10*time.Second, func() error {
		if syscall.Kill(pid, 0) == nil {
			return fmt.Errorf("helper %d still runs", pid)
		}
		if out, _ := h.Run(context.Background(), "ip", "-o", "link", "show"); strings.Contains(out, "vmn-") {
			return fmt.Errorf("links left:\n%s", out)
		}
		return nil
	}, "down --all through the other spelling to leave nothing")
}

// TestReboot: a host reboots. Its state dir under /run is gone, and so is
// every bridge, TAP, nftables table and process; the controller the
// service starts at boot (`vmnetctl serve`, no other argument) finds the
// projects where they were kept (/var/lib/vmnetctl) and brings every
// network and helper back, the leases with them.
func TestReboot(t *testing.T) {
	h := &host{Host: simvm.NewHostIn(t, "/run", "vmrb", networksYAML, "pgrep"), t: t}
	vms := h.WriteFile("vms.yaml", twoVMs)
	h.MustVmnetctl("up", "-f", vms)
	before := h.Status()
	vm := h.VM(h.Attachment(before, "a"))
	lease := vm.DHCP(t)["ip"]
	vm.Close()

	// The reboot: every process and what the kernel held, and /run.
	exec.Command("pkill", "-9", "-f", h.StateDir()).Run()
	testutil.Eventually(t, 10*time.Second, func() error {
		if out, _ := exec.Command("pgrep", "-af", h.StateDir()).Output(); len(out) > 0 {
			return fmt.Errorf("still running: %s", out)
		}
		return nil
	}, "the controller and helpers to die")
	h.MustRun(t, "nft", "flush", "ruleset")
	for _, l := range strings.Fields(h.MustRun(t, "sh", "-c", "ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1")) {
		if l == "lo" {
			continue
		}
		// (A dead helper's TAP goes by itself, when the kernel gets to
		// it: it may be gone by now.)
		if out, err := h.Run(context.Background(), "ip", "link", "del", l); err != nil && !strings.Contains(out+err.Error(), "Cannot find device") {
			t.Fatalf("ip link del %s: %v\n%s", l, err, out)
		}
	}
	if err := os.RemoveAll(h.StateDir()); err != nil {
		t.Fatal(err)
	}

	// The service's start.
	serve := h.NS.Command(context.Background(), h.Binary, "--state-dir", h.StateDir(), "serve", "--metrics-addr", "off")
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { serve.Process.Kill(); serve.Wait() })
	testutil.Eventually(t, 60*time.Second, func() error {
		st, err := h.ReadStatus()
		if err != nil {
			return err
		}
		running := 0
		for _, a := range st.Attachments {
			if a.State == "running" {
				running++
			}
		}
		if running != len(before.Attachments) {
			return fmt.Errorf("%d of %d attachments running", running, len(before.Attachments))
		}
		for _, n := range st.Networks {
			if n.State != "up" {
				return fmt.Errorf("network %s is %s", n.Name, n.State)
			}
		}
		return nil
	}, "every network and helper to come back")
	vm = h.VM(h.Attachment(h.Status(), "a"))
	if again := vm.DHCP(t)["ip"]; again != lease {
		t.Errorf("after the reboot, a leased %s, had %s: the leases were not kept", again, lease)
	}
	h.MustVmnetctl("down", "--all")
}

// TestReload: SIGHUP to the controller (systemctl reload) reads the
// networks.yaml and the VM files again from where `up` read them: a
// network added to one and a VM added to the other come up without an
// `up`. A VM file broken since changes nothing, and says why
// (reload-failed, naming the file).
func TestReload(t *testing.T) {
	h := newHost(t)
	vms := h.WriteFile("vms.yaml", "vms:\n  a:\n    networks: [{vmnet: shared}]\n")
	h.MustVmnetctl("up", "-f", vms)
	hangup := func() {
		t.Helper()
		pid := h.Status().Controller.PID
		if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	h.WriteFile("networks.yaml", networksYAML+"  lab:\n    mode: host\n    subnet: 10.76.0.0/24\n")
	h.WriteFile("vms.yaml", "vms:\n  a:\n    networks: [{vmnet: shared}]\n  b:\n    networks: [{vmnet: lab}]\n")
	hangup()
	testutil.Eventually(t, 60*time.Second, func() error {
		st, err := h.ReadStatus()
		if err != nil {
			return err
		}
		for _, a := range st.Attachments {
			if a.VM == "b" && a.Network == "lab" && a.State == "running" {
				return nil
			}
		}
		return fmt.Errorf("b is not running on lab: %+v", st.Attachments)
	}, "the reload to bring VM b up on the new network")
	if out := h.MustVmnetctl("events"); !strings.Contains(out, "reloaded") {
		t.Errorf("no reloaded event:\n%s", out)
	}

	h.WriteFile("vms.yaml", "vms:\n  a:\n    networks: [{vmnet: nosuch}]\n")
	hangup()
	testutil.Eventually(t, 60*time.Second, func() error {
		if out := h.MustVmnetctl("events"); !strings.Contains(out, "reload-failed") || !strings.Contains(out, vms) {
			return fmt.Errorf("no reload-failed event naming %s:\n%s", vms, out)
		}
		return nil
	}, "the broken reload to say why")
	st := h.Status()
	if len(st.Attachments) != 2 {
		t.Errorf("a broken reload changed the attachments: %+v", st.Attachments)
	}
	h.MustVmnetctl("down", "--all")
}
