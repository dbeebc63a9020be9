// Package controller_test drives the vmnetctl binary end to end, as root,
// inside network namespaces the tests create: up, plan, status, supervision,
// controller crashes and down.
package controller_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/netplane"
	"github.com/vmnetctl/vmnetctl/procid"
	"github.com/vmnetctl/vmnetctl/relay"
	"github.com/vmnetctl/vmnetctl/statedir"
	"github.com/vmnetctl/vmnetctl/test/simvm"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

func TestMain(m *testing.M) { simvm.Main(m) }

// host is the machine under test (simvm.Host) with short names for the checks.
type host struct {
	*simvm.Host
	t *testing.T
}

// The shared network's DHCP pool is a narrow range, so that a lease is
// checked against it exactly.
const (
	networksYAML = `
vmnet:
  shared:
    subnet: 10.77.0.0/24
    dhcpRange: {start: ` + poolStart + `, end: ` + poolEnd + `}
  isolated:
    mode: host
    subnet: 10.78.0.0/24
    isolation: true
`
	gateway   = "10.77.0.1"
	poolStart = "10.77.0.100"
	poolEnd   = "10.77.0.150"
)

func newHost(t *testing.T) *host {
	return &host{Host: simvm.NewHost(t, "vmnh", networksYAML, "pgrep"), t: t}
}

func pids(st *ctlapi.Status) map[string]int {
	m := map[string]int{}
	for _, a := range st.Attachments {
		m[fmt.Sprintf("%s/%d", a.VM, a.Index)] = a.PID
	}
	return m
}

const twoVMs = `
vms:
  a:
    networks:
      - vmnet: shared
  b:
    networks:
      - vmnet: shared
`

func TestLifecycle(t *testing.T) {
	h := newHost(t)
	before, _ := h.Run(context.Background(), "nft", "list", "ruleset")
	vms := h.WriteFile("vms.yaml", twoVMs)

	// up: both attachments run; two simulated VMs lease and reach each other.
	out := h.MustVmnetctl("up", "-f", vms)
	if strings.Count(out, "running") != 2 {
		t.Fatalf("up printed:\n%s", out)
	}
	st := h.Status()
	a, b := h.VM(h.Attachment(st, "a")), h.VM(h.Attachment(st, "b"))
	la, lb := a.DHCP(t), b.DHCP(t)
	for name, l := range map[string]map[string]string{"a": la, "b": lb} {
		if err := testutil.InRange(l["ip"], poolStart, poolEnd); err != nil || l["router"] != gateway {
			t.Fatalf("%s's lease %v: want an address in the pool (%v) and router %s", name, l, err, gateway)
		}
	}
	if la["ip"] == lb["ip"] {
		t.Fatalf("a and b both leased %s", la["ip"])
	}
	if err := a.Ping(lb["ip"], 3); err != nil {
		t.Fatalf("a cannot reach b: %v", err)
	}
	if err := a.Ping(gateway, 1); err != nil {
		t.Fatalf("a cannot reach the gateway: %v", err)
	}
	testutil.Eventually(t, 10*time.Second, func() error {
		st := h.Status()
		for vm, l := range map[string]map[string]string{"a": la, "b": lb} {
			if got := h.Attachment(st, vm).IP; got != l["ip"] {
				return fmt.Errorf("status says %s has %q, the lease is %q", vm, got, l["ip"])
			}
		}
		return nil
	}, "status to report a's and b's leases")

	// up again: nothing changes, the same helpers run.
	pidsBefore := pids(h.Status())
	if out := h.MustVmnetctl("plan", "-f", vms); strings.TrimSpace(out) != "No changes." {
		t.Errorf("plan of the applied file:\n%s", out)
	}
	h.MustVmnetctl("up", "-f", vms)
	if got := pids(h.Status()); fmt.Sprint(got) != fmt.Sprint(pidsBefore) {
		t.Errorf("up twice restarted helpers: %v then %v", pidsBefore, got)
	}

	// plan after an edit shows exactly the edit.
	edited := h.WriteFile("vms.yaml", twoVMs+"  c:\n    networks:\n      - vmnet: shared\n")
	planOut := h.MustVmnetctl("plan", "-f", edited)
	if !strings.Contains(planOut, "+   c/0: c on shared") || !strings.Contains(planOut, "Plan: 1 to create, 0 to change, 0 to replace, 0 to delete.") || strings.Contains(planOut, "a/0") {
		t.Errorf("plan after adding c:\n%s", planOut)
	}
	h.WriteFile("vms.yaml", twoVMs)

	// kill -9 a helper: it comes back, same MAC and address, traffic resumes.
	old := h.Attachment(h.Status(), "a")
	syscall.Kill(old.PID, syscall.SIGKILL)
	testutil.Eventually(t, 10*time.Second, func() error {
		cur := h.Attachment(h.Status(), "a")
		if cur.State != ctlapi.StateRunning || cur.PID == old.PID || cur.Restarts != 1 {
			return fmt.Errorf("state %s pid %d restarts %d", cur.State, cur.PID, cur.Restarts)
		}
		return nil
	}, "the helper to restart")
	testutil.Eventually(t, 10*time.Second, func() error { return a.Ping(lb["ip"], 1) }, "traffic to resume")
	if again := a.DHCP(t); again["ip"] != la["ip"] {
		t.Errorf("after the restart a leased %s, before %s", again["ip"], la["ip"])
	}

	// kill -9 the controller during a ping flood: nothing is lost; the next
	// controller adopts the same helpers.
	pidsBefore = pids(h.Status())
	flood := a.Command(context.Background(), "ping", "-n", "-q", "-f", "-c", "3000", "-w", "30", lb["ip"])
	var floodOut strings.Builder
	flood.Stdout, flood.Stderr = &floodOut, &floodOut
	if err := flood.Start(); err != nil {
		t.Fatal(err)
	}
	ctlPID := h.controllerPID()
	syscall.Kill(ctlPID, syscall.SIGKILL)
	if err := flood.Wait(); err != nil {
		t.Fatalf("ping flood across a controller crash: %v\n%s", err, floodOut.String())
	}
	if !strings.Contains(floodOut.String(), " 0% packet loss") {
		t.Errorf("ping flood lost packets:\n%s", floodOut.String())
	}
	offline := h.Status()
	if offline.Controller.Running || h.Attachment(offline, "a").State != ctlapi.StateRunning {
		t.Errorf("status without a controller: %+v", offline)
	}
	h.MustVmnetctl("up", "-f", vms)
	if got := pids(h.Status()); fmt.Sprint(got) != fmt.Sprint(pidsBefore) {
		t.Errorf("the new controller did not adopt the helpers: %v then %v", pidsBefore, got)
	}
	if err := a.Ping(lb["ip"], 1); err != nil {
		t.Errorf("after the new controller: %v", err)
	}

	// down: no link, rule, process, socket or state file of ours remains.
	h.MustVmnetctl("down", "-f", vms)
	links, _ := h.Run(context.Background(), "ip", "-br", "link")
	if strings.TrimSpace(links) != "" && len(strings.Split(strings.TrimSpace(links), "\n")) != 1 {
		t.Errorf("links left after down:\n%s", links)
	}
	after, _ := h.Run(context.Background(), "nft", "list", "ruleset")
	if after != before {
		t.Errorf("nftables after down differs:\n%s", after)
	}
	if out, err := exec.Command("pgrep", "-f", h.StateDir()).Output(); err == nil {
		t.Errorf("processes left after down:\n%s", out)
	}
	entries, _ := os.ReadDir(h.StateDir())
	for _, e := range entries {
		switch e.Name() {
		case "ops.lock", "projects.lock", "controller.lock", "controller.log", "events.jsonl":
		default:
			t.Errorf("state left after down: %s", e.Name())
		}
	}
	if _, err := h.Vmnetctl("down", "-f", vms); err != nil {
		t.Errorf("down twice: %v", err)
	}
}

// network is the status of network name; it fails the test if there is
// none.
func (h *host) network(name string) ctlapi.NetworkStatus {
	h.t.Helper()
	for _, n := range h.Status().Networks {
		if n.Name == name {
			return n
		}
	}
	h.t.Fatalf("no network %s in status", name)
	return ctlapi.NetworkStatus{}
}

func (h *host) controllerPID() int {
	h.t.Helper()
	st := h.Status()
	if !st.Controller.Running || st.Controller.PID == 0 {
		h.t.Fatalf("no controller runs: %+v", st.Controller)
	}
	return st.Controller.PID
}

func TestBadInputChangesNothing(t *testing.T) {
	h := newHost(t)
	bad := h.WriteFile("bad.yaml", "vms:\n  a:\n    networks:\n      - vmnet: nope\n")
	out, err := h.Vmnetctl("up", "-f", bad)
	if err == nil || out != "" || !strings.Contains(err.Error(), `bad.yaml:4: vms.a.networks[0].vmnet: network "nope" is not defined`) {
		t.Fatalf("up with a bad file: out %q, err %v", out, err)
	}
	if _, err := os.Stat(filepath.Join(h.StateDir(), "projects")); err == nil {
		t.Errorf("a bad file created state")
	}
	links, _ := h.Run(context.Background(), "ip", "-br", "link")
	if strings.Count(strings.TrimSpace(links), "\n") != 0 {
		t.Errorf("a bad file created links:\n%s", links)
	}
}

func TestConcurrentUpDown(t *testing.T) {
	h := newHost(t)
	one := h.WriteFile("one.yaml", "vms:\n  one:\n    networks: [{vmnet: shared}]\n")
	two := h.WriteFile("two.yaml", "vms:\n  two:\n    networks: [{vmnet: isolated}]\n")
	errs := make(chan error, 2)
	go func() { _, err := h.Vmnetctl("up", "-f", one); errs <- err }()
	go func() { _, err := h.Vmnetctl("up", "-f", two); errs <- err }()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	st := h.Status()
	if len(st.Attachments) != 2 || h.Attachment(st, "one").State != ctlapi.StateRunning || h.Attachment(st, "two").State != ctlapi.StateRunning {
		t.Fatalf("after two concurrent ups: %+v", st.Attachments)
	}
	go func() { _, err := h.Vmnetctl("down", "-f", one); errs <- err }()
	go func() { _, err := h.Vmnetctl("down", "-f", two); errs <- err }()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if st := h.Status(); len(st.Attachments) != 0 || st.Controller.Running {
		t.Fatalf("after two concurrent downs: %+v", st)
	}
}

func TestRunStopsHelpersWithTheCommand(t *testing.T) {
	h := newHost(t)
	vms := h.WriteFile("vms.yaml", twoVMs)
	gate := filepath.Join(h.Dir, "gate")
	// The command waits for the test to open the gate, then exits 7.
	script := fmt.Sprintf(`echo "fds=$VMNETCTL_FDS"; [ -S /proc/self/fd/4 ] || ls -l /proc/self/fd/4 | grep -q socket || exit 99; while [ ! -e %s ]; do sleep 0.05; done; exit 7`, gate)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	run := h.VmnetctlCommand(ctx, "run", "-f", vms, "--vm", "a", "--", "sh", "-c", script)
	var out strings.Builder
	run.Stdout, run.Stderr = &out, &out
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	var helperPID int
	testutil.Eventually(t, 20*time.Second, func() error {
		st := h.Status()
		for _, a := range st.Attachments {
			if a.VM == "a" && a.State == ctlapi.StateRunning && a.PID > 0 {
				helperPID = a.PID
				return nil
			}
		}
		return fmt.Errorf("attachments: %+v", st.Attachments)
	}, "run's helper to run")
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err := run.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Fatalf("run exited with %v, want the command's status 7\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "fds=4") {
		t.Errorf("the command did not get fd 4:\n%s", out.String())
	}
	if syscall.Kill(helperPID, 0) == nil {
		t.Errorf("helper %d still runs after the command exited", helperPID)
	}
	if st := h.Status(); len(st.Attachments) != 0 {
		t.Errorf("run's project is still up: %+v", st.Attachments)
	}
}

// TestRunHandsTheTAP: `vmnetctl run` gives the command an `attach: tap`
// attachment's TAP itself (qemu's -netdev tap,fd=N), not a socketpair: the
// descriptor after the socket attachment's is /dev/net/tun attached to the
// TAP that status reports, which is on the network's bridge with a carrier
// while the command holds it, and gone when run ends.
func TestRunHandsTheTAP(t *testing.T) {
	h := newHost(t)
	vms := h.WriteFile("vms.yaml", "vms:\n  k:\n    networks:\n      - vmnet: shared\n      - vmnet: shared\n        attach: tap\n")
	gate := filepath.Join(h.Dir, "gate")
	script := fmt.Sprintf(`echo "fds=$VMNETCTL_FDS vhost=$VMNETCTL_VHOSTFDS"; echo "fd5=$(readlink /proc/self/fd/5)"; grep iff /proc/self/fdinfo/5; while [ ! -e %s ]; do sleep 0.05; done`, gate)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	run := h.VmnetctlCommand(ctx, "run", "-f", vms, "--vm", "k", "--", "sh", "-c", script)
	var out testutil.Buffer
	run.Stdout, run.Stderr = &out, &out
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	var tap string
	testutil.Eventually(t, 20*time.Second, func() error {
		for _, a := range h.Status().Attachments {
			if a.VM == "k" && a.Index == 1 && a.State == ctlapi.StateRunning && a.Tap != "" && strings.Contains(out.String(), "iff") {
				tap = a.Tap
				return nil
			}
		}
		return fmt.Errorf("output so far: %s", out.String())
	}, "run's TAP attachment to run and the command to report its descriptors")
	want := []string{"fds=4,5 vhost=", "fd5=/dev/net/tun", "iff:\t" + tap}
	if netplane.VhostNet() {
		want[0] = "fds=4,5 vhost=,6"
	}
	for _, w := range want {
		if !strings.Contains(out.String(), w) {
			t.Errorf("the command's output has no %q:\n%s", w, out.String())
		}
	}
	link, err := h.Run(ctx, "ip", "-d", "link", "show", tap)
	if err != nil || !strings.Contains(link, "master vmn-") || strings.Contains(link, "NO-CARRIER") {
		t.Errorf("TAP %s is not on the bridge with a carrier while the command holds it: %v\n%s", tap, err, link)
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run.Wait(); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	testutil.Eventually(t, 10*time.Second, func() error {
		if out, err := h.Run(ctx, "ip", "link", "show", tap); err == nil {
			return fmt.Errorf("TAP still there:\n%s", out)
		}
		return nil
	}, "the TAP to go with run")
}

// TestTapHelperKilledWithItsCleanup: a TAP attachment's helper killed
// together with the controller's link reaper, which deletes its
// persistent TAP, leaves the TAP behind; the controller must remove it (it
// carries the helper's mark) so that the restarted helper can create it
// again, with a reaper started again to watch it, and down removes it
// too.
func TestTapHelperKilledWithItsCleanup(t *testing.T) {
	h := newHost(t)
	vms := h.WriteFile("vms.yaml", "vms:\n  fc:\n    networks:\n      - vmnet: shared\n        attach: tap\n")
	h.MustVmnetctl("up", "-f", vms)
	old := h.Attachment(h.Status(), "fc")
	if old.Tap == "" {
		t.Fatalf("no TAP: %+v", old)
	}
	// The reaper first: it would delete the TAP once the helper is gone.
	reaper := h.linkReaper(old.PID)
	syscall.Kill(reaper, syscall.SIGKILL)
	syscall.Kill(-old.PID, syscall.SIGKILL)
	testutil.Eventually(t, 15*time.Second, func() error {
		cur := h.Attachment(h.Status(), "fc")
		if cur.State != ctlapi.StateRunning || cur.PID == old.PID {
			return fmt.Errorf("state %s pid %d: %s", cur.State, cur.PID, cur.Error)
		}
		return nil
	}, "the TAP helper to be back")
	if out, err := h.Run(context.Background(), "ip", "-d", "link", "show", old.Tap); err != nil || !strings.Contains(out, "vmnetctl:tap=") {
		t.Errorf("the new TAP is missing or unmarked: %v\n%s", err, out)
	}
	h.linkReaper(h.Attachment(h.Status(), "fc").PID) // a new one watches the new TAP
	h.MustVmnetctl("down", "-f", vms)
	if out, err := h.Run(context.Background(), "ip", "link", "show", old.Tap); err == nil {
		t.Errorf("TAP left after down:\n%s", out)
	}
}

// TestTapHelperKilledAlone: kill -9 of a TAP attachment's helper, the
// relay that holds its TAP, and of nothing else: the controller's link
// reaper (in a process group of its own) deletes the TAP, as a VM's
// interface goes with its vmnet-helper; the controller starts the helper
// again, with a TAP of its own.
func TestTapHelperKilledAlone(t *testing.T) {
	h := newHost(t)
	vms := h.WriteFile("vms.yaml", "vms:\n  fc:\n    networks:\n      - vmnet: shared\n        attach: tap\n")
	h.MustVmnetctl("up", "-f", vms)
	old := h.Attachment(h.Status(), "fc")
	index := func() string {
		out, err := h.Run(context.Background(), "cat", "/sys/class/net/"+old.Tap+"/ifindex")
		if err != nil {
			return ""
		}
		return strings.TrimSpace(out)
	}
	if index() == "" {
		t.Fatalf("no TAP %s", old.Tap)
	}
	h.linkReaper(old.PID) // there is one
	h.killTapHelper(t, old, index)
	h.MustVmnetctl("down", "-f", vms)
	if out, err := h.Run(context.Background(), "ip", "link", "show", old.Tap); err == nil {
		t.Errorf("TAP left after down:\n%s", out)
	}
}

// TestTapCountsInStatus: a TAP attachment's helper counts nothing (it
// writes no stats: its stats file stays empty); the controller reads the
// TAP's kernel counters every stats interval: what the VMM wrote into the
// TAP is what the VM sent, in the status.
func TestTapCountsInStatus(t *testing.T) {
	h := newHost(t)
	vms := h.WriteFile("vms.yaml", "vms:\n  fc:\n    networks:\n      - vmnet: shared\n        attach: tap\n")
	h.MustVmnetctl("up", "-f", vms)
	a := h.Attachment(h.Status(), "fc")
	hw, _ := net.ParseMAC(a.MAC)
	frame := make([]byte, 100)
	copy(frame, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(frame[6:], hw)
	frame[12], frame[13] = 0x88, 0xb5 // local experimental: nobody answers
	h.MustDo(t, func() error {
		fd, err := testutil.OpenTAP(a.Tap)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		for range 3 {
			if _, err := unix.Write(fd, frame); err != nil {
				return err
			}
		}
		return nil
	})
	testutil.Eventually(t, 30*time.Second, func() error {
		if got := h.Attachment(h.Status(), "fc"); got.RxBytes != 300 || got.LastFrameAt.IsZero() {
			return fmt.Errorf("rx bytes %d, last frame at %v", got.RxBytes, got.LastFrameAt)
		}
		return nil
	}, "fc's status to count the 3 frames of 100 bytes its VMM wrote")
	if b, _ := os.ReadFile(statedir.Dir{Path: h.StateDir()}.HelperStatsFile("fc/0")); len(b) > 0 {
		t.Errorf("fc's helper wrote stats: %q", b)
	}
}

// killTapHelper kills a's helper (attach: tap) with SIGKILL and waits for
// its TAP to go and a new helper to run with a TAP of its own: index
// reads the TAP's interface index ("" without one).
func (h *host) killTapHelper(t *testing.T, a ctlapi.AttachmentStatus, index func() string) {
	t.Helper()
	oldIndex := index()
	syscall.Kill(a.PID, syscall.SIGKILL)
	testutil.Eventually(t, 30*time.Second, func() error {
		cur := h.Attachment(h.Status(), a.VM)
		if cur.State != ctlapi.StateRunning || cur.PID == a.PID {
			return fmt.Errorf("state %s pid %d: %s", cur.State, cur.PID, cur.Error)
		}
		if i := index(); i == "" || i == oldIndex {
			return fmt.Errorf("TAP %s: interface index %q (the killed helper's was %s)", a.Tap, i, oldIndex)
		}
		return nil
	}, "the killed helper's TAP to go and a new helper to make its own")
}

// linkReaper is the pid of the controller's link reaper (relay.Reap),
// which watches the TAP of one of its helpers (pid helper): it holds a
// pipe that helper holds too.
func (h *host) linkReaper(helper int) int {
	h.t.Helper()
	pid, err := h.findLinkReaper(helper)
	if err != nil {
		h.t.Fatal(err)
	}
	return pid
}

// findLinkReaper is linkReaper, with an error when there is none.
func (h *host) findLinkReaper(helper int) (int, error) {
	ctl := h.controllerPID()
	ids, err := procid.Processes(func(cmdline []string) bool {
		return len(cmdline) == 3 && cmdline[1] == relay.ReapArg
	})
	if err != nil {
		return 0, err
	}
	held := pipesOf(helper)
	for _, id := range ids {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", id.PID))
		if i := bytes.LastIndexByte(stat, ')'); err == nil && i > 0 {
			if f := strings.Fields(string(stat[i+1:])); len(f) > 1 && f[1] == strconv.Itoa(ctl) {
				for p := range pipesOf(id.PID) {
					if held[p] {
						return id.PID, nil
					}
				}
			}
		}
	}
	return 0, fmt.Errorf("no link reaper under the controller (pid %d) watches helper %d's TAP: %+v", ctl, helper, ids)
}

// TestTapReaperKilled: the controller's link reaper killed while two
// TAP attachments' helpers hold their TAPs: the controller starts another
// and gives it both TAPs, so that the TAP of a helper killed after goes
// with it (a new helper makes a TAP of its own), and down leaves none.
func TestTapReaperKilled(t *testing.T) {
	h := newHost(t)
	vms := h.WriteFile("vms.yaml", "vms:\n  fc:\n    networks:\n      - vmnet: shared\n        attach: tap\n  ch:\n    networks:\n      - vmnet: shared\n        attach: tap\n")
	h.MustVmnetctl("up", "-f", vms)
	st := h.Status()
	fc, ch := h.Attachment(st, "fc"), h.Attachment(st, "ch")
	old := h.linkReaper(fc.PID)
	if other := h.linkReaper(ch.PID); other != old {
		t.Fatalf("two reapers, %d and %d: want one for the controller", old, other)
	}
	syscall.Kill(old, syscall.SIGKILL)
	testutil.Eventually(t, 30*time.Second, func() error {
		for _, a := range []ctlapi.AttachmentStatus{fc, ch} {
			if pid, err := h.findLinkReaper(a.PID); err != nil || pid == old {
				return fmt.Errorf("%s: reaper %d, %v", a.VM, pid, err)
			}
		}
		return nil
	}, "a new reaper to watch both TAPs")
	index := func() string {
		out, err := h.Run(context.Background(), "cat", "/sys/class/net/"+fc.Tap+"/ifindex")
		if err != nil {
			return ""
		}
		return strings.TrimSpace(out)
	}
	h.killTapHelper(t, fc, index)
	// The controller keeps a copy of each watched TAP's pipe, and drops
	// the killed helper's once its reaper has it: one a TAP, none leaked.
	testutil.Eventually(t, 30*time.Second, func() error {
		if n := len(pipesOf(h.controllerPID())); n != 2 {
			return fmt.Errorf("the controller holds %d pipes", n)
		}
		return nil
	}, "the controller to hold a pipe a TAP")
	h.MustVmnetctl("down", "-f", vms)
	for _, a := range []ctlapi.AttachmentStatus{fc, ch} {
		if out, err := h.Run(context.Background(), "ip", "link", "show", a.Tap); err == nil {
			t.Errorf("TAP left after down:\n%s", out)
		}
	}
}

// TestTapDeletedEndsItsHelper: the TAP of an attach: tap attachment deleted
// behind its helper's back (ip link del) ends the helper, as a relay's
// TAP does; the controller starts it again, which makes the TAP again:
// marked, guarded and on the bridge.
func TestTapDeletedEndsItsHelper(t *testing.T) {
	h := newHost(t)
	vms := h.WriteFile("vms.yaml", "vms:\n  fc:\n    networks:\n      - vmnet: shared\n        attach: tap\n")
	h.MustVmnetctl("up", "-f", vms)
	st := h.Status()
	old, br := h.Attachment(st, "fc"), st.Networks[0].Bridge
	h.MustRun(t, "ip", "link", "del", old.Tap)
	testutil.Eventually(t, 15*time.Second, func() error {
		cur := h.Attachment(h.Status(), "fc")
		if cur.State != ctlapi.StateRunning || cur.PID == old.PID {
			return fmt.Errorf("state %s pid %d (was %d): %s", cur.State, cur.PID, old.PID, cur.Error)
		}
		out, err := h.Run(context.Background(), "ip", "-d", "link", "show", old.Tap)
		if err != nil || !strings.Contains(out, "master "+br) || !strings.Contains(out, "alias vmnetctl:tap="+old.Tap+"@") {
			return fmt.Errorf("TAP %s is not back, marked, on %s: %v\n%s", old.Tap, br, err, out)
		}
		if out, _ := h.Run(context.Background(), "nft", "list", "set", "bridge", hostnet.TableName("shared"), "guarded"); !strings.Contains(out, `"`+old.Tap+`"`) {
			return fmt.Errorf("%s is not guarded: %s", old.Tap, out)
		}
		return nil
	}, "the helper of fc to end with its TAP and be started again")
	if d := h.MustVmnetctl("describe", "fc"); !strings.Contains(d, "TAP "+old.Tap+" was deleted") {
		t.Errorf("describe fc does not say why its helper ended:\n%s", d)
	}
	h.MustVmnetctl("down", "-f", vms)
	if out, err := h.Run(context.Background(), "ip", "link", "show", old.Tap); err == nil {
		t.Errorf("TAP left after down:\n%s", out)
	}
}

// TestTapHelperKilledAsItsTapPersists: a TAP attachment's TAP outlives its
// helper from the instant it is made persistent, before the helper has
// started the child that deletes it. It must carry the helper's mark from
// then on: the helper's process group killed at that instant leaves a TAP
// that the next helper of the attachment removes and makes again, and that
// down removes, not one they refuse as somebody else's.
func TestTapHelperKilledAsItsTapPersists(t *testing.T) {
	h := newHost(t)
	ctx := t.Context()
	vms := h.WriteFile("vms.yaml", "vms:\n  fc:\n    networks:\n      - vmnet: shared\n        attach: tap\n")
	h.MustVmnetctl("network", "create", "shared") // the network stays up without fc
	h.MustVmnetctl("up", "-f", vms)
	tap := h.Attachment(h.Status(), "fc").Tap
	h.MustVmnetctl("down", "-f", vms)
	testutil.Eventually(t, 10*time.Second, func() error {
		if out, err := h.Run(ctx, "ip", "link", "show", tap); err == nil {
			return fmt.Errorf("still there:\n%s", out)
		}
		return nil
	}, "fc's TAP %s to go with down", tap)

	// A helper for fc's TAP, as the controller starts it, killed with its
	// group as soon as the TAP persists: before the helper goes on to start
	// its cleanup child, guard the port and attach it. (Polled without
	// pause: the kernel sends no notice when a TAP that is down persists.)
	helper := h.NS.Command(ctx, h.Binary, "helper", "--networks", h.Networks, "--network", "shared", "--tap", tap, "--attach", "tap")
	helper.Env = append(os.Environ(), "VMNETCTL_UNDER_CONTROLLER=1", hostnet.OwnerEnv(h.StateDir()))
	helper.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-helper.Process.Pid, syscall.SIGKILL); helper.Wait() })
	var persisting *netlink.Tuntap
	if err := h.Do(func() error {
		for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); {
			// One RTM_GETLINK: persistence and alias as of one instant.
			if l, err := netlink.LinkByName(tap); err == nil {
				if tt, ok := l.(*netlink.Tuntap); ok && !tt.NonPersist {
					syscall.Kill(-helper.Process.Pid, syscall.SIGKILL)
					persisting = tt
					return nil
				}
			}
		}
		return fmt.Errorf("TAP %s did not persist", tap)
	}); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(persisting.Alias, "vmnetctl:tap="+tap+"@") {
		t.Errorf("TAP %s persists unmarked (alias %q): a helper killed now leaves a TAP nothing removes", tap, persisting.Alias)
	}
	helper.Wait()
	if out, err := h.Run(ctx, "ip", "-d", "link", "show", tap); err == nil {
		t.Logf("left by the killed helper:\n%s", out)
	}

	// The next helper of fc removes what was left and runs; down removes
	// its TAP.
	if out, err := h.Vmnetctl("up", "-f", vms); err != nil {
		t.Fatalf("up after the helper was killed as its TAP persisted: %v\n%s", err, out)
	}
	if a := h.Attachment(h.Status(), "fc"); a.State != ctlapi.StateRunning || a.Tap != tap {
		t.Errorf("fc after up: %+v", a)
	}
	h.MustVmnetctl("down", "--all")
	if out, err := h.Run(ctx, "ip", "link", "show", tap); err == nil {
		t.Errorf("TAP left after down --all:\n%s", out)
	}
}

// link joins h's namespace and peer with a veth pair: hostIf with
// hostAddr on h's side, eth0 with peerAddrs on peer's, both up.
func link(t *testing.T, h *host, hostIf, hostAddr string, peer *testutil.NS, peerAddrs ...string) {
	t.Helper()
	testutil.Run(t, "ip", "-n", h.Name, "link", "add", hostIf, "type", "veth", "peer", "name", "eth0", "netns", peer.Name)
	h.MustRun(t, "ip", "addr", "add", hostAddr, "dev", hostIf)
	h.MustRun(t, "ip", "link", "set", hostIf, "up")
	for _, a := range peerAddrs {
		args := []string{"addr", "add", a, "dev", "eth0"}
		if strings.Contains(a, ":") {
			args = append(args, "nodad") // usable at once
		}
		peer.MustRun(t, "ip", args...)
	}
	peer.MustRun(t, "ip", "link", "set", "eth0", "up")
}

// TestProjectNameTaken: `up -f p2/vms.yaml` where `up -f p1/vms.yaml`
// made project "vms" is refused, saying how to name it, and p1's VM stays
// (issue 32: it replaced the project, its VM removed, without a word);
// with -p it comes up beside it.
func TestProjectNameTaken(t *testing.T) {
	h := newHost(t)
	p1 := h.WriteFile("p1/vms.yaml", "vms:\n  alpha:\n    networks:\n      - vmnet: shared\n")
	p2 := h.WriteFile("p2/vms.yaml", "vms:\n  beta:\n    networks:\n      - vmnet: shared\n")
	h.MustVmnetctl("up", "-f", p1, "--metrics-addr", "off")
	_, err := h.Vmnetctl("up", "-f", p2, "--metrics-addr", "off")
	if err == nil || !strings.Contains(err.Error(), `project "vms"`) || !strings.Contains(err.Error(), "-p NAME") {
		t.Fatalf("up of another vms.yaml: %v, want it refused with -p NAME", err)
	}
	h.Attachment(h.Status(), "alpha") // still there
	h.MustVmnetctl("up", "-f", p2, "-p", "p2", "--metrics-addr", "off")
	st := h.Status()
	h.Attachment(st, "alpha")
	h.Attachment(st, "beta")
	// The same file again is the same project: its edit is an update.
	h.WriteFile("p1/vms.yaml", "vms:\n  alpha:\n    networks:\n      - vmnet: isolated\n")
	h.MustVmnetctl("up", "-f", p1, "--metrics-addr", "off")
	h.MustVmnetctl("down", "--all")
}

// TestUpOthersNetworks: an up that names a networks.yaml which changes a
// network another project's VMs use is refused, naming the network and
// the project (issue 32: it replaced it without a word); plan shows the
// change, and --force makes it.
func TestUpOthersNetworks(t *testing.T) {
	h := newHost(t)
	a := h.WriteFile("a.yaml", "vms:\n  a1:\n    networks:\n      - vmnet: shared\n")
	b := h.WriteFile("b.yaml", "vms:\n  b1:\n    networks:\n      - vmnet: shared\n")
	h.MustVmnetctl("up", "-f", a, "--metrics-addr", "off")
	h.MustVmnetctl("up", "-f", b, "--metrics-addr", "off")
	other := h.WriteFile("other.yaml", strings.Replace(networksYAML, "subnet: 10.77.0.0/24\n    dhcpRange: {start: "+poolStart+", end: "+poolEnd+"}", "subnet: 10.79.0.0/24", 1))
	if other == "" || !strings.Contains(mustRead(t, other), "10.79.0.0/24") {
		t.Fatal("the other networks.yaml does not change shared's subnet")
	}
	_, err := h.Vmnetctl("--networks", other, "up", "-f", a, "--metrics-addr", "off")
	if err == nil || !strings.Contains(err.Error(), "network shared would be replaced (project b uses it)") || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("up changing b's network: %v, want it refused naming shared and b", err)
	}
	// plan says so too.
	out, _ := h.VmnetctlCommand(context.Background(), "--networks", other, "plan", "-f", a).CombinedOutput()
	if !strings.Contains(string(out), "warning: up needs --force: network shared would be replaced (project b uses it)") {
		t.Errorf("plan of the change says:\n%s\nwant the warning that up needs --force", out)
	}
	if got := h.network("shared").Subnet; got != "10.77.0.0/24" {
		t.Errorf("after the refused up, shared's subnet is %s", got)
	}
	h.MustVmnetctl("--networks", other, "up", "-f", a, "--force", "--metrics-addr", "off")
	if got := h.network("shared").Subnet; got != "10.79.0.0/24" {
		t.Errorf("after up --force, shared's subnet is %s, want 10.79.0.0/24", got)
	}
	h.MustVmnetctl("down", "--all")
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestDetachRemovesItsGuard: `down` of one VM's project removes its port's
// guard in the pass that detached it, and the guard of the VM that stays
// is kept. A pass that only attaches reads no other port's guard (issue
// 30: the same cost with 1,000 VMs as with none), so the pass that stops
// a helper must be the one told to look for the guards of gone ports.
func TestDetachRemovesItsGuard(t *testing.T) {
	h := newHost(t)
	a := h.WriteFile("a.yaml", "vms:\n  a:\n    networks: [{vmnet: shared}]\n")
	b := h.WriteFile("b.yaml", "vms:\n  b:\n    networks: [{vmnet: shared}]\n")
	h.MustVmnetctl("up", "-f", a, "-p", "a")
	h.MustVmnetctl("up", "-f", b, "-p", "b")
	guarded := func() int {
		t.Helper()
		out, err := h.Run(context.Background(), "nft", "-j", "list", "set", "bridge", hostnet.TableName("shared"), "guarded")
		if err != nil {
			t.Fatalf("reading the guard's ports: %v\n%s", err, out)
		}
		var set struct {
			Nftables []struct {
				Set *struct {
					Elem []json.RawMessage `json:"elem"`
				} `json:"set"`
			} `json:"nftables"`
		}
		if err := json.Unmarshal([]byte(out), &set); err != nil {
			t.Fatalf("nft's listing of the guard's ports: %v\n%s", err, out)
		}
		for _, o := range set.Nftables {
			if o.Set != nil {
				return len(o.Set.Elem)
			}
		}
		return 0
	}
	if n := guarded(); n != 2 {
		t.Fatalf("with a and b attached, %d ports guarded, want 2", n)
	}
	// The helpers' records know their TAPs' indexes: the pass that stops
	// b's looks at that port's guard alone.
	rt, _, err := statedir.Dir{Path: h.StateDir()}.LoadRuntime()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rt.Helpers {
		out, err := h.Run(context.Background(), "cat", "/sys/class/net/"+r.Tap+"/ifindex")
		if index := strings.TrimSpace(out); err != nil || strconv.Itoa(r.TapIndex) != index {
			t.Errorf("%s's record: tap %s, tapIndex %d; its ifindex is %s", r.Key, r.Tap, r.TapIndex, index)
		}
	}
	h.MustVmnetctl("down", "-p", "b")
	if n := guarded(); n != 1 {
		t.Errorf("after b's down, %d ports guarded, want 1 (a's)", n)
	}
}

// TestBandwidthLive: a VM file's bandwidth is set on the VM's port by
// `up` (a token bucket to the VM, a marked IFB device shaping what it
// sends), shown in status; an `up` that changes it changes the kernel's
// without restarting the helper; one without it takes it off, and so
// does `down`, the IFB device with it.
func TestBandwidthLive(t *testing.T) {
	h := newHost(t)
	h.MustVmnetctl("network", "create", "shared") // the network outlives the VM
	vms := h.WriteFile("vms.yaml", "vms:\n  bw:\n    networks:\n      - vmnet: shared\n        bandwidth: {toVM: 20Mbit, fromVM: 10Mbit}\n")
	h.MustVmnetctl("up", "-f", vms)
	a := h.Attachment(h.Status(), "bw")
	if a.Bandwidth == nil || a.Bandwidth.ToVM != 20_000_000 || a.Bandwidth.FromVM != 10_000_000 {
		t.Errorf("status shows bandwidth %+v", a.Bandwidth)
	}
	ifb := api.ShaperName(a.Tap)
	tc := func(dev string) string {
		out, _ := h.Run(context.Background(), "tc", "qdisc", "show", "dev", dev)
		return out
	}
	if q := tc(a.Tap); !strings.Contains(q, "tbf") || !strings.Contains(q, "rate 20Mbit") {
		t.Errorf("the port's qdiscs:\n%s", q)
	}
	if q := tc(ifb); !strings.Contains(q, "rate 10Mbit") {
		t.Errorf("the IFB device's qdiscs:\n%s", q)
	}
	h.WriteFile("vms.yaml", "vms:\n  bw:\n    networks:\n      - vmnet: shared\n        bandwidth: {toVM: 5Mbit}\n")
	h.MustVmnetctl("up", "-f", vms)
	b := h.Attachment(h.Status(), "bw")
	if b.PID != a.PID {
		t.Errorf("changing the limit restarted the helper: pid %d, then %d", a.PID, b.PID)
	}
	if q := tc(a.Tap); !strings.Contains(q, "rate 5Mbit") {
		t.Errorf("after the change, the port's qdiscs:\n%s", q)
	}
	if out, err := h.Run(context.Background(), "ip", "link", "show", ifb); err == nil {
		t.Errorf("no limit from the VM any more, and its IFB device is left:\n%s", out)
	}
	h.WriteFile("vms.yaml", "vms:\n  bw:\n    networks:\n      - vmnet: shared\n        bandwidth: {fromVM: 1Mbit}\n")
	h.MustVmnetctl("up", "-f", vms)
	if q := tc(a.Tap); strings.Contains(q, "tbf") {
		t.Errorf("no limit to the VM any more, and the port has:\n%s", q)
	}
	if q := tc(ifb); !strings.Contains(q, "rate 1Mbit") {
		t.Errorf("the IFB device's qdiscs:\n%s", q)
	}
	h.MustVmnetctl("down", "-f", vms)
	if out, err := h.Run(context.Background(), "ip", "link", "show", ifb); err == nil {
		t.Errorf("after down, the IFB device is left:\n%s", out)
	}
}

// TestCapture: `vmnetctl capture VM -w FILE` writes the frames of the
// VM's port as they pass, as pcapng that gopacket's reader reads: the
// VM's DHCP exchange and its pings of the gateway, each on the interface
// of its direction, and on interrupt says how many it wrote.
func TestCapture(t *testing.T) {
	h := newHost(t)
	h.MustVmnetctl("up", "-f", h.WriteFile("vms.yaml", "vms:\n  cap:\n    networks: [{vmnet: shared}]\n"))
	vm := h.VM(h.Attachment(h.Status(), "cap"))
	file := filepath.Join(t.TempDir(), "cap.pcapng")
	cmd := h.VmnetctlCommand(context.Background(), "capture", "cap", "-w", file)
	var errOut strings.Builder
	cmd.Stderr = &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })
	testutil.Eventually(t, 30*time.Second, func() error {
		if fi, err := os.Stat(file); err != nil || fi.Size() == 0 {
			return fmt.Errorf("no capture header in %s yet (%v)", file, err)
		}
		return nil
	}, "the capture to start")
	vm.DHCP(t)
	if err := vm.Ping(gateway, 2); err != nil {
		t.Fatal(err)
	}
	cmd.Process.Signal(os.Interrupt)
	if err := <-done; err != nil {
		t.Fatalf("capture: %v\n%s", err, errOut.String())
	}
	var said uint64
	if _, err := fmt.Sscanf(errOut.String(), "capture of cap: frames=%d (interrupted)", &said); err != nil {
		t.Errorf("capture said: %q (%v)", errOut.String(), err)
	}
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := pcapgo.NewNgReader(f, pcapgo.DefaultNgReaderOptions)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	var frames uint64
	for {
		data, ci, err := r.ReadPacketData()
		if err != nil {
			break
		}
		frames++
		p := gopacket.NewPacket(data, layers.LayerTypeEthernet, gopacket.Default)
		dir := map[int]string{0: "from", 1: "to"}[ci.InterfaceIndex]
		if udp, ok := p.Layer(layers.LayerTypeUDP).(*layers.UDP); ok && (udp.DstPort == 67 || udp.DstPort == 68) {
			seen["dhcp "+dir]++
		}
		if icmp, ok := p.Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4); ok {
			seen[fmt.Sprintf("icmp %d %s", icmp.TypeCode.Type(), dir)]++
		}
	}
	for _, want := range []string{"dhcp from", "dhcp to", "icmp 8 from", "icmp 0 to"} {
		if seen[want] == 0 {
			t.Errorf("no %s the VM in the capture: %v", want, seen)
		}
	}
	if said != frames {
		t.Errorf("capture said it wrote %d frames; the file holds %d", said, frames)
	}
	// Ended by --count: the controller's own count, with the kernel's
	// drops, in the trailer; with --filter, only the frames it passes
	// (the echo replies, not the requests).
	var counted strings.Builder
	two := filepath.Join(t.TempDir(), "two.pcapng")
	c2 := h.VmnetctlCommand(context.Background(), "capture", "cap", "-w", two, "--count", "2", "--filter", "icmp[icmptype] == icmp-echoreply")
	c2.Stderr = &counted
	if err := c2.Start(); err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() { ended <- c2.Wait() }()
	testutil.Eventually(t, 30*time.Second, func() error {
		select {
		case err := <-ended:
			ended <- err
			return nil
		default:
		}
		vm.Ping(gateway, 1)
		return errors.New("the capture of two frames has not ended")
	}, "two frames captured")
	if err := <-ended; err != nil || strings.TrimSpace(counted.String()) != "capture of cap: frames=2 dropped=0" {
		t.Errorf("capture --count 2: %v, said %q", err, counted.String())
	}
	if b, err := os.ReadFile(two); err != nil {
		t.Error(err)
	} else if r2, err := pcapgo.NewNgReader(bytes.NewReader(b), pcapgo.DefaultNgReaderOptions); err != nil {
		t.Error(err)
	} else {
		for {
			data, _, err := r2.ReadPacketData()
			if err != nil {
				break
			}
			icmp, ok := gopacket.NewPacket(data, layers.LayerTypeEthernet, gopacket.Default).Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4)
			if !ok || icmp.TypeCode.Type() != layers.ICMPv4TypeEchoReply {
				t.Errorf("capture --filter of echo replies holds another frame: %x", data)
			}
		}
	}
	if out, err := h.Vmnetctl("capture", "cap", "-w", two, "--filter", "tcp port"); err == nil || !strings.Contains(err.Error(), `--filter "tcp port": can't parse filter expression: syntax error`) {
		t.Errorf("capture with a bad filter: %v\n%s", err, out)
	}
	if in, err := r.Interface(0); err != nil || in.Name != "cap/0 on shared: from the VM" {
		t.Errorf("the capture's first interface: %q (%v)", in.Name, err)
	}
}

// TestPartitions: a network's partitions cut what passes between its
// groups of VMs and keep what passes within each: with [[a, b], [c]], a
// reaches b and not c; an up with [[a], [b, c]] changes that live,
// without restarting a helper; without partitions all reach each other
// again. Status names them.
func TestPartitions(t *testing.T) {
	h := newHost(t)
	parted := func(p string) {
		t.Helper()
		yaml := networksYAML
		if p != "" {
			yaml = strings.Replace(networksYAML, "  shared:\n", "  shared:\n    partitions: "+p+"\n", 1)
		}
		if err := os.WriteFile(h.Networks, []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		h.MustVmnetctl("up", "-f", h.WriteFile("vms.yaml", "vms:\n  a:\n    networks: [{vmnet: shared}]\n  b:\n    networks: [{vmnet: shared}]\n  c:\n    networks: [{vmnet: shared}]\n"))
	}
	parted("[[a, b], [c]]")
	st := h.Status()
	vms := map[string]*simvm.VM{}
	ips := map[string]string{}
	for _, name := range []string{"a", "b", "c"} {
		vms[name] = h.VM(h.Attachment(st, name))
		ips[name] = vms[name].DHCP(t)["ip"]
	}
	before := pids(st)
	reaches := func(from, to string, want bool) {
		t.Helper()
		if !want {
			if err := vms[from].Ping(ips[to], 2); err == nil {
				t.Errorf("%s reached %s across the partition", from, to)
			}
			return
		}
		// Reached: once the VMs' neighbour caches forget what the
		// partition kept from them (an ARP reply that was dropped).
		testutil.Eventually(t, 30*time.Second, func() error { return vms[from].Ping(ips[to], 1) }, "%s to reach %s", from, to)
	}
	reaches("a", "b", true)
	reaches("a", "c", false)
	reaches("c", "b", false)
	if out := h.MustVmnetctl("status"); !strings.Contains(out, "shared: partitions [a, b], [c]") {
		t.Errorf("status does not name the partitions:\n%s", out)
	}
	parted("[[a], [b, c]]")
	reaches("b", "c", true)
	reaches("a", "b", false)
	parted("")
	reaches("a", "c", true)
	reaches("a", "b", true)
	if got := pids(h.Status()); !maps.Equal(got, before) {
		t.Errorf("changing the partitions restarted helpers: %v, then %v", before, got)
	}
}

// series is the value of the controller's metric name{labels} (name
// alone without labels), from its /metrics at the default address.
func (h *host) series(name, labels string) (float64, error) {
	resp, err := h.HTTPClient().Get("http://" + ctlapi.DefaultMetricsAddr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	series := name + `\{` + regexp.QuoteMeta(labels) + `\}`
	if labels == "" {
		series = name
	}
	m := regexp.MustCompile(`(?m)^` + series + ` (\S+)$`).FindSubmatch(b)
	if m == nil {
		return 0, fmt.Errorf("no %s{%s} in the metrics", name, labels)
	}
	return strconv.ParseFloat(string(m[1]), 64)
}
