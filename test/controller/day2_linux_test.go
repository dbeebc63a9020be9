package controller_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/ops"
	"github.com/vmnetctl/vmnetctl/statedir"
	"github.com/vmnetctl/vmnetctl/test/simvm"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// exitCode runs vmnetctl and returns its exit status and stdout.
func exitCode(t *testing.T, h *host, args ...string) (int, string) {
	t.Helper()
	cmd := h.VmnetctlCommand(context.Background(), args...)
	out, err := cmd.Output()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &ee):
		return ee.ExitCode(), string(out)
	}
	t.Fatal(err)
	return 0, ""
}

// TestDay2: leases (with and without a controller), plan's detailed exit
// code, and up's exit status when something did not come up.
func TestDay2(t *testing.T) {
	h := newHost(t)
	vms := h.WriteFile("vms.yaml", twoVMs)
	h.MustVmnetctl("up", "-f", vms)
	st := h.Status()
	ips := map[string]string{}
	for _, vm := range []string{"a", "b"} {
		ips[vm] = h.VM(h.Attachment(st, vm)).DHCP(t)["ip"]
	}
	checkLeases := func(when string) {
		t.Helper()
		var l ops.LeaseList
		if err := json.Unmarshal([]byte(h.MustVmnetctl("leases", "--json")), &l); err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, x := range l.Leases {
			got[x.VM] = x.IP
			if x.Network != "shared" || x.MAC == "" || !x.Expiry.After(time.Now()) {
				t.Errorf("%s: lease %+v", when, x)
			}
		}
		if len(l.Leases) != 2 || got["a"] != ips["a"] || got["b"] != ips["b"] {
			t.Errorf("%s: leases %+v, want a at %s and b at %s", when, l.Leases, ips["a"], ips["b"])
		}
	}
	checkLeases("with a controller")
	if out := h.MustVmnetctl("leases", "shared"); !strings.Contains(out, ips["a"]) || !strings.Contains(out, "EXPIRES") {
		t.Errorf("leases shared:\n%s", out)
	}
	if _, err := h.Vmnetctl("leases", "nope"); err == nil {
		t.Errorf("leases of a network that is not up: no error")
	}

	// logs: a VM's helpers, each line prefixed; without a VM the controller.
	if out := h.MustVmnetctl("logs", "a"); !strings.Contains(out, "a/0 | ") || !strings.Contains(out, "forwarding started") {
		t.Errorf("logs a:\n%s", out)
	}
	if out := h.MustVmnetctl("logs"); !strings.Contains(out, "controller started") {
		t.Errorf("logs:\n%s", out)
	}
	if _, err := h.Vmnetctl("logs", "nope"); err == nil || !strings.Contains(err.Error(), "VMs that are up: [a b]") {
		t.Errorf("logs of a VM that is not up: %v", err)
	}
	// Shell completion offers the VMs and networks that are up.
	if out := h.MustVmnetctl("__complete", "logs", ""); !strings.Contains(out, "a\nb\n") {
		t.Errorf("completion of logs' VM:\n%s", out)
	}
	if out := h.MustVmnetctl("__complete", "leases", ""); !strings.Contains(out, "shared\n") {
		t.Errorf("completion of leases' network:\n%s", out)
	}
	if out := h.MustVmnetctl("__complete", "down", "-p", ""); !strings.Contains(out, "vms\n") {
		t.Errorf("completion of down -p:\n%s", out)
	}

	// status: each attachment's peer, last frame and the MAC the bridge saw.
	testutil.Eventually(t, 15*time.Second, func() error {
		for _, x := range h.Status().Attachments {
			if x.Peer != "connected" || x.LastFrameAt.IsZero() || len(x.SeenMACs) != 1 || x.SeenMACs[0] != x.MAC {
				return fmt.Errorf("%s: peer %q, last frame %v, seen MACs %v (MAC %s)", x.VM, x.Peer, x.LastFrameAt, x.SeenMACs, x.MAC)
			}
		}
		return nil
	}, "status to show the VMs connected")

	// describe: the VM is connected, has its lease, and nothing to do.
	var d ops.Description
	if err := json.Unmarshal([]byte(h.MustVmnetctl("describe", "a", "--json")), &d); err != nil {
		t.Fatal(err)
	}
	if len(d.Attachments) != 1 || d.Attachments[0].Peer != "connected" || d.Attachments[0].Lease == nil ||
		d.Attachments[0].Lease.IP != ips["a"] || len(d.Attachments[0].Advice) != 0 || len(d.Attachments[0].LogTail) == 0 {
		t.Errorf("describe a: %+v", d)
	}
	if out := h.MustVmnetctl("describe", "a"); !strings.Contains(out, "peer:        connected") || !strings.Contains(out, ips["a"]) {
		t.Errorf("describe a:\n%s", out)
	}
	if l := d.Attachments[0].LastDHCP; l == nil || l.Kind != "lease-granted" || l.IP != ips["a"] || l.Time.IsZero() {
		t.Errorf("describe a: last DHCP %+v, want lease-granted of %s", l, ips["a"])
	}
	if d.Attachments[0].LastHelperError != nil {
		t.Errorf("describe a: a last helper error before any: %+v", d.Attachments[0].LastHelperError)
	}

	// logs -f and events -f print what happens next: a helper killed
	// (kill -9) and restarted.
	follow := func(args ...string) *bufio.Reader {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		cmd := h.VmnetctlCommand(ctx, args...)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cancel(); cmd.Wait() })
		r := bufio.NewReader(stdout)
		// What is there already comes first, up to the last line now.
		lines := len(strings.Split(strings.TrimSpace(h.MustVmnetctl(args[:len(args)-1]...)), "\n"))
		for range lines {
			if _, err := r.ReadString('\n'); err != nil {
				t.Fatalf("%v: %v", args, err)
			}
		}
		return r
	}
	eventsF := follow("events", "--json", "-f")
	logsF := follow("logs", "a", "-f")
	killed := h.Attachment(h.Status(), "a").PID
	syscall.Kill(killed, syscall.SIGKILL)
	line, err := eventsF.ReadString('\n')
	var ev ctlapi.Event
	if err != nil || json.Unmarshal([]byte(line), &ev) != nil || ev.Kind != "helper-exited" || ev.Attachment != "a/0" {
		t.Errorf("events -f: the first new line after a's helper was killed: %q (%v), want helper-exited of a/0", line, err)
	}
	if line, err := logsF.ReadString('\n'); err != nil || !strings.HasPrefix(line, "a/0 | ") {
		t.Errorf("logs a -f: the first new line after a's helper was killed: %q (%v)", line, err)
	}
	testutil.Eventually(t, 15*time.Second, func() error {
		if cur := h.Attachment(h.Status(), "a"); cur.State != ctlapi.StateRunning || cur.PID == killed {
			return fmt.Errorf("a/0 is %s, pid %d", cur.State, cur.PID)
		}
		return nil
	}, "a's helper to restart")
	// describe keeps the helper's last error after its restart.
	if err := json.Unmarshal([]byte(h.MustVmnetctl("describe", "a", "--json")), &d); err != nil {
		t.Fatal(err)
	}
	if e := d.Attachments[0].LastHelperError; e == nil || e.Kind != "helper-exited" || !strings.Contains(e.Detail, "helper exited") {
		t.Errorf("describe a after its helper was killed: last helper error %+v", e)
	}
	if out := h.MustVmnetctl("describe", "a"); !strings.Contains(out, "last error:  helper-exited") || !strings.Contains(out, "last DHCP:   lease-granted "+ips["a"]) {
		t.Errorf("describe a:\n%s", out)
	}

	// A VM that sends from another MAC than its own (no guard on its
	// port): describe says which, and what to do.
	h.MustVmnetctl("up", "-f", h.WriteFile("m.yaml", "vms:\n  m:\n    networks:\n      - vmnet: shared\n        spoofCheck: false\n"))
	m := h.Attachment(h.Status(), "m")
	mvm := simvm.AttachSocket(t, "vmm", "52:55:55:aa:bb:cc", m.Socket, filepath.Join(h.Dir, "m.client.sock"))
	mvm.Ping(gateway, 1) // frames from 52:55:55:aa:bb:cc
	testutil.Eventually(t, 15*time.Second, func() error {
		var d ops.Description
		if err := json.Unmarshal([]byte(h.MustVmnetctl("describe", "m", "--json")), &d); err != nil {
			return err
		}
		for _, adv := range d.Attachments[0].Advice {
			if strings.Contains(adv, "the VM sends from MAC 52:55:55:aa:bb:cc, not "+m.MAC) && strings.Contains(adv, "vmnetctl args m") {
				return nil
			}
		}
		return fmt.Errorf("seen MACs %v, advice %q", d.Attachments[0].SeenMACs, d.Attachments[0].Advice)
	}, "describe m to advise on the MAC it sends from")
	mvm.Close()
	h.MustVmnetctl("down", "-p", "m")

	// events: what happened, as JSON lines and for people.
	kinds := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(h.MustVmnetctl("events", "--json")), "\n") {
		var ev ctlapi.Event
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("events --json: %q: %v", line, err)
		}
		kinds[ev.Kind+" "+ev.Attachment+" "+ev.Network] = true
		if ev.Kind == "lease-granted" && ev.IP != ips[strings.TrimSuffix(ev.Attachment, "/0")] {
			t.Errorf("event %+v: the lease is %s", ev, ips[strings.TrimSuffix(ev.Attachment, "/0")])
		}
	}
	for _, want := range []string{"network-up  shared", "helper-started a/0 shared", "helper-started b/0 shared", "lease-granted a/0 shared", "lease-granted b/0 shared"} {
		if !kinds[want] {
			t.Errorf("no event %q in %v", want, kinds)
		}
	}
	if out := h.MustVmnetctl("events"); !strings.Contains(out, "lease-granted") || !strings.Contains(out, "a/0 on shared") {
		t.Errorf("events:\n%s", out)
	}

	// A user who may not use the controller or read the state dir is told
	// what to do, by every verb that reads it.
	for _, verb := range [][]string{{"status"}, {"describe", "a"}, {"args", "a"}, {"leases"}, {"events"}, {"logs"}, {"logs", "a"}, {"network", "list"}, {"network", "inspect", "shared"}} {
		out, err := h.Run(context.Background(), "setpriv", append([]string{"--reuid", "65534", "--regid", "65534", "--clear-groups"}, h.VmnetctlArgs(verb...)...)...)
		if err == nil || !strings.Contains(out, "run with sudo") {
			t.Errorf("%v as nobody: %v\n%s", verb, err, out)
		}
	}

	// A VM another project defines: the error names that project.
	other := h.WriteFile("other.yaml", "vms:\n  a:\n    networks:\n      - vmnet: shared\n")
	if _, err := h.Vmnetctl("up", "-f", other); err == nil || !strings.Contains(err.Error(), "(projects vms and other: `vmnetctl down -p` one of them first") {
		t.Errorf("up of a VM another project defines: %v", err)
	}

	// plan --detailed-exitcode: 0 without changes, 2 with.
	if code, out := exitCode(t, h, "plan", "--detailed-exitcode", "-f", vms); code != 0 {
		t.Errorf("plan --detailed-exitcode of the applied file: exit %d\n%s", code, out)
	}
	edited := h.WriteFile("edited.yaml", twoVMs+"  c:\n    networks:\n      - vmnet: shared\n")
	if code, out := exitCode(t, h, "plan", "--detailed-exitcode", "-p", "vms", "-f", edited); code != 2 || !strings.Contains(out, "c/0") {
		t.Errorf("plan --detailed-exitcode of an edit: exit %d, want 2\n%s", code, out)
	}

	// Without a controller, status and leases still read the leases.
	for _, p := range h.Pids() {
		if b, err := exec.Command("cat", "/proc/"+strconv.Itoa(p)+"/cmdline").Output(); err == nil && strings.Contains(string(b), "serve") && strings.Contains(string(b), h.StateDir()) {
			syscall.Kill(p, syscall.SIGKILL)
		}
	}
	testutil.Eventually(t, 10*time.Second, func() error {
		if st := h.Status(); st.Controller.Running {
			return errors.New("the controller still answers")
		}
		return nil
	}, "the controller to be gone")
	offline := h.Status()
	for _, vm := range []string{"a", "b"} {
		if got := h.Attachment(offline, vm).IP; got != ips[vm] {
			t.Errorf("offline status: %s's IP is %q, want %s", vm, got, ips[vm])
		}
	}
	if offline.Networks[0].Leases != 2 {
		t.Errorf("offline status: %d leases on shared, want 2", offline.Networks[0].Leases)
	}
	checkLeases("without a controller")
	if out := h.MustVmnetctl("describe", "b"); !strings.Contains(out, "no controller runs") {
		t.Errorf("describe b without a controller gives no advice:\n%s", out)
	}

	// up of a VM whose network cannot come up (a link of the bridge's
	// name that is not vmnetctl's) prints the status and exits 1.
	h.MustRun(t, "ip", "link", "add", "vmn-isolated", "type", "veth", "peer", "name", "other0")
	bad := h.WriteFile("bad.yaml", "vms:\n  d:\n    networks:\n      - vmnet: isolated\n")
	if code, out := exitCode(t, h, "up", "-f", bad, "--json"); code != 1 || !json.Valid([]byte(out)) {
		t.Errorf("up of a VM on a network that cannot come up: exit %d (want 1), stdout valid JSON: %v\n%s", code, json.Valid([]byte(out)), out)
	}

	// up of a VM whose attachment cannot start (a link of its TAP's name
	// that is not vmnetctl's), on a network that is up: exit 1 too.
	e := h.WriteFile("e.yaml", "vms:\n  e:\n    networks:\n      - vmnet: shared\n")
	h.MustVmnetctl("up", "-f", e)
	tap := h.Attachment(h.Status(), "e").Tap
	h.MustVmnetctl("down", "-f", e)
	h.MustRun(t, "ip", "link", "add", tap, "type", "veth", "peer", "name", "other1")
	code, out := exitCode(t, h, "up", "-f", e, "--json")
	var est ctlapi.Status
	if err := json.Unmarshal([]byte(out), &est); code != 1 || err != nil || h.Attachment(&est, "e").State == ctlapi.StateRunning {
		t.Errorf("up of a VM whose TAP cannot be made: exit %d (want 1), JSON %v\n%s", code, err, out)
	}
	for _, n := range est.Networks {
		if n.Name == "shared" && n.State != "up" {
			t.Errorf("network shared is %s: the attachment, not the network, should fail", n.State)
		}
	}
}

// TestVMRestartFollowed: a VMM that exits and starts again on the same
// client socket path, five times, is served by the same helper (the
// restart counter stays at zero, no backoff), and its VM gets its address
// each time. While it is gone, frames sent towards it are not drops and
// its peer is "VM gone"; a TAP attachment with no VMM is "waiting for VM"
// and the broadcasts it cannot take are not drops either.
func TestVMRestartFollowed(t *testing.T) {
	h := newHost(t)
	h.MustVmnetctl("up", "-f", h.WriteFile("vms.yaml", "vms:\n  a:\n    networks:\n      - vmnet: shared\n"))
	att := h.Attachment(h.Status(), "a")
	client := filepath.Join(h.Dir, "a.client.sock")
	var ip string
	for round := range 6 {
		vm := simvm.AttachSocket(t, fmt.Sprintf("a%d", round), att.MAC, att.Socket, client)
		// One DISCOVER only (udhcpc -t 1): the first after the VMM's
		// restart must be answered.
		lease, err := vm.NS.DHCP(t, "eth0", "-t", "1", "-T", "3")
		if err != nil {
			b, _ := os.ReadFile(statedir.Dir{Path: h.StateDir()}.HelperLogFile("a/0"))
			t.Fatalf("round %d: %v\nhelper log:\n%s", round, err, b)
		}
		if ip = lease["ip"]; testutil.InRange(ip, poolStart, poolEnd) != nil {
			t.Fatalf("round %d: lease %q", round, ip)
		}
		waitPeer(t, h, "a", "connected")
		if round == 5 {
			break
		}
		vm.Close() // the VMM exits
	}
	got := h.Attachment(h.Status(), "a")
	if got.PID != att.PID || got.Restarts != 0 || got.State != "running" {
		t.Errorf("after six VMM starts: helper pid %d (was %d), %d restarts, %s; want the same helper, no restart",
			got.PID, att.PID, got.Restarts, got.State)
	}
}

// TestNothingThere: frames with no VM to take them are not drops: a VM
// gone for a while with pings sent to its address ("VM gone"), and a TAP
// attachment with no VMM with broadcasts on its bridge ("waiting for VM").
// When the VM comes back its first DISCOVER is answered.
func TestNothingThere(t *testing.T) {
	h := newHost(t)
	h.Env = append(h.Env, ctlapi.EnvStatsInterval+"=200ms")
	h.MustVmnetctl("up", "-f", h.WriteFile("vms.yaml", "vms:\n  a:\n    networks:\n      - vmnet: shared\n  t:\n    networks:\n      - vmnet: shared\n        attach: tap\n"))
	att := h.Attachment(h.Status(), "a")
	client := filepath.Join(h.Dir, "a.client.sock")
	vm := simvm.AttachSocket(t, "a0", att.MAC, att.Socket, client)
	ip := vm.DHCP(t)["ip"]
	waitPeer(t, h, "a", "connected")
	waitPeer(t, h, "t", "waiting for VM")
	vm.Close() // the VMM exits, leaving its socket file as qemu does
	waitPeer(t, h, "a", "VM gone")

	// Traffic towards the VM that is gone (unicast once the host knows its
	// MAC) and broadcasts that reach the TAP nobody opened.
	h.Run(context.Background(), "ping", "-c", "5", "-i", "0.2", "-W", "1", ip)
	h.Run(context.Background(), "ping", "-c", "5", "-i", "0.2", "-W", "1", "10.77.0.99") // ARP broadcasts
	for _, key := range []string{"a/0", "t/0"} {
		waitStatsLine(t, h, key)
	}
	st := h.Status()
	for _, vm := range []string{"a", "t"} {
		if a := h.Attachment(st, vm); a.Drops != 0 {
			t.Errorf("%s (peer %q): %d drops for frames no VM was there to take", vm, a.Peer, a.Drops)
		}
	}
	if a := h.Attachment(st, "a"); a.Peer != "VM gone" {
		t.Errorf("a's peer after its VMM exited: %q, want VM gone", a.Peer)
	}
	if a := h.Attachment(st, "t"); a.Peer != "waiting for VM" {
		t.Errorf("t's peer with no VMM: %q, want waiting for VM", a.Peer)
	}

	// The VMM comes back: connected, and its first DISCOVER is answered.
	vm = simvm.AttachSocket(t, "a1", att.MAC, att.Socket, client)
	if _, err := vm.NS.DHCP(t, "eth0", "-t", "1", "-T", "3"); err != nil {
		t.Fatalf("the first DISCOVER after the VM came back: %v", err)
	}
	waitPeer(t, h, "a", "connected")
}

// waitPeer waits for vm's attachment to have peer.
func waitPeer(t *testing.T, h *host, vm, peer string) {
	t.Helper()
	testutil.Eventually(t, 15*time.Second, func() error {
		if got := h.Attachment(h.Status(), vm).Peer; got != peer {
			return fmt.Errorf("%s's peer is %q", vm, got)
		}
		return nil
	}, vm+"'s peer to be "+peer)
}

// waitStatsLine waits for the stats of key to be taken once more (the
// status's StatsAt): stats taken after the call hold every frame its
// helper relayed, or its TAP counted, before. A helper rewrites its stats
// file every interval while its counters move, and every heartbeat (60
// intervals) while they do not, and the controller reads a held TAP's
// counters the same way, so the wait is an interval or a heartbeat.
func waitStatsLine(t *testing.T, h *host, key string) {
	t.Helper()
	vm, _, _ := strings.Cut(key, "/")
	latest := func() time.Time { return h.Attachment(h.Status(), vm).StatsAt }
	before := latest()
	testutil.Eventually(t, time.Minute, func() error {
		if !latest().After(before) {
			return fmt.Errorf("its latest stats still from %v", before)
		}
		return nil
	}, key+"'s helper to report its stats again")
}

// TestNetworkVerbs: networks as objects of their own, with no VM.
func TestNetworkVerbs(t *testing.T) {
	h := newHost(t)
	list := func() map[string]ops.NetworkInfo {
		t.Helper()
		var l ops.NetworkList
		if err := json.Unmarshal([]byte(h.MustVmnetctl("network", "list", "--json")), &l); err != nil {
			t.Fatal(err)
		}
		m := map[string]ops.NetworkInfo{}
		for _, n := range l.Networks {
			m[n.Name] = n
		}
		return m
	}
	if l := list(); l["shared"].State != "down" || l["isolated"].State != "down" || l["isolated"].Kept {
		t.Fatalf("network list before anything: %+v", l)
	}
	var created ctlapi.Status
	if err := json.Unmarshal([]byte(h.MustVmnetctl("network", "create", "isolated", "--json")), &created); err != nil {
		t.Fatalf("network create --json: %v", err)
	}
	if len(created.Networks) != 1 || created.Networks[0].Name != "isolated" || created.Networks[0].State != "up" {
		t.Errorf("network create --json: networks %+v", created.Networks)
	}
	if l := list(); l["isolated"].State != "up" || !l["isolated"].Kept || l["shared"].State != "down" {
		t.Fatalf("network list after network create isolated: %+v", l)
	}
	h.MustRun(t, "ip", "link", "show", "vmn-isolated")

	h.MustVmnetctl("up", "-f", h.WriteFile("vms.yaml", "vms:\n  a:\n    networks:\n      - vmnet: shared\n"))
	var info ops.NetworkInfo
	if err := json.Unmarshal([]byte(h.MustVmnetctl("network", "inspect", "shared", "--json")), &info); err != nil {
		t.Fatal(err)
	}
	if info.State != "up" || info.Config == nil || info.Config.Subnet.String() != "10.77.0.0/24" || len(info.VMs) != 1 || info.VMs[0] != "a" {
		t.Errorf("network inspect shared: %+v", info)
	}
	if _, err := h.Vmnetctl("network", "create", "nope"); err == nil || !strings.Contains(err.Error(), "its networks: ") {
		t.Errorf("network create of an undefined network: %v", err)
	}

	// status --watch --json: one JSON document each time, until stopped.
	ctx, cancel := context.WithCancel(context.Background())
	watch := h.VmnetctlCommand(ctx, "status", "--watch", "1s", "--json")
	stdout, err := watch.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := watch.Start(); err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(stdout)
	for i := range 2 {
		var st ctlapi.Status
		if err := dec.Decode(&st); err != nil || len(st.Attachments) != 1 || !st.Controller.Running {
			t.Errorf("status --watch 1s --json, document %d: %v %+v", i, err, st)
		}
	}
	watch.Process.Signal(syscall.SIGINT)
	if err := watch.Wait(); err != nil {
		t.Errorf("status --watch stopped by SIGINT: %v", err)
	}
	cancel()

	var deleted ops.NetworkDeleted
	if err := json.Unmarshal([]byte(h.MustVmnetctl("network", "delete", "isolated", "--json")), &deleted); err != nil {
		t.Fatalf("network delete --json: %v", err)
	}
	if deleted != (ops.NetworkDeleted{Network: "isolated", WasKept: true, State: "down"}) {
		t.Errorf("network delete --json: %+v", deleted)
	}
	if l := list(); l["isolated"].State != "down" || l["shared"].State != "up" {
		t.Errorf("network list after network delete isolated: %+v", l)
	}
	if _, err := h.Run(context.Background(), "ip", "link", "show", "vmn-isolated"); err == nil {
		t.Errorf("vmn-isolated still exists after network delete")
	}
	if err := json.Unmarshal([]byte(h.MustVmnetctl("network", "delete", "isolated", "--json")), &deleted); err != nil || deleted.WasKept {
		t.Errorf("network delete --json twice: %v %+v", err, deleted) // twice is fine
	}
	if out := h.MustVmnetctl("network", "delete", "isolated"); out != "network isolated is not kept (network create makes one)\n" {
		t.Errorf("network delete of a network not kept printed %q", out)
	}
	// A network that does not exist is an error, not "not kept".
	if out, err := h.Vmnetctl("network", "delete", "nosuch"); err == nil || !strings.Contains(err.Error(), `network "nosuch" is not defined`) {
		t.Errorf("network delete nosuch: %v\n%s", err, out)
	}
	if out := h.MustVmnetctl("down", "--all"); !strings.Contains(out, "Everything is down.") {
		t.Errorf("down --all:\n%s", out)
	}
}

// startHelperCold runs `vmnetctl helper ARGS --socket PATH` on h and
// returns it and its VM's MAC once it printed its JSON line.
func startHelperCold(t *testing.T, h *host, sock string, args ...string) (*exec.Cmd, string) {
	t.Helper()
	cmd := h.VmnetctlCommand(context.Background(), append([]string{"helper", "--socket", sock}, args...)...)
	hp := runContractHelper(t, h, filepath.Base(sock), cmd, nil)
	mac, _ := hp.ready["vmnet_mac_address"].(string)
	if mac == "" {
		t.Fatalf("JSON line %q has no vmnet_mac_address", hp.line)
	}
	return cmd, mac
}

// TestHelperStartedCold: a `vmnetctl helper` started on a network that is
// not up, with no controller and no project, brings the network up (as
// vmnet does on macOS) and its VM gets a lease; once the helper is gone,
// the network goes.
func TestHelperStartedCold(t *testing.T) {
	h := newHost(t)
	sock := filepath.Join(h.Dir, "cold.sock")
	cmd, mac := startHelperCold(t, h, sock, "--network", "shared")
	vm := simvm.AttachSocket(t, "cold", mac, sock, filepath.Join(h.Dir, "cold.client.sock"))
	if ip := vm.DHCP(t)["ip"]; testutil.InRange(ip, poolStart, poolEnd) != nil {
		t.Errorf("lease %q, want one of the pool", ip)
	}
	// The helper goes: so do its hold and the network.
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
	testutil.Eventually(t, 20*time.Second, func() error {
		if _, err := h.Run(context.Background(), "ip", "link", "show", "vmn-shared"); err == nil {
			return errors.New("vmn-shared is still there")
		}
		return nil
	}, "the network to go with its last helper")
}

// TestNetworkOnDemand: vmnet-helper's address flags that no network of
// networks.yaml has make one on demand, as vmnet does: two helpers with
// the same flags share it, their VMs lease from its range and see each
// other, and it goes with the last of them.
func TestNetworkOnDemand(t *testing.T) {
	h := newHost(t)
	flags := []string{"--operation-mode", "shared", "--start-address", "10.96.0.1", "--end-address", "10.96.0.50", "--subnet-mask", "255.255.255.0"}
	var cmds []*exec.Cmd
	var ips []string
	for i := range 2 {
		sock := filepath.Join(h.Dir, fmt.Sprintf("od%d.sock", i))
		cmd, mac := startHelperCold(t, h, sock, flags...)
		cmds = append(cmds, cmd)
		vm := simvm.AttachSocket(t, fmt.Sprintf("od%d", i), mac, sock, filepath.Join(h.Dir, fmt.Sprintf("od%d.client.sock", i)))
		lease := vm.DHCP(t)
		if testutil.InRange(lease["ip"], "10.96.0.2", "10.96.0.50") != nil || lease["router"] != "10.96.0.1" {
			t.Fatalf("helper %d: lease %v, want 10.96.0.2-50 with router 10.96.0.1", i, lease)
		}
		ips = append(ips, lease["ip"])
		if i == 1 {
			if err := vm.Ping(ips[0], 2); err != nil {
				t.Errorf("the second VM cannot reach the first on the network made on demand: %v", err)
			}
		}
	}
	if nets := h.Status().Networks; len(nets) != 1 || nets[0].Subnet != "10.96.0.0/24" {
		t.Errorf("networks: %+v, want one made on demand, 10.96.0.0/24", nets)
	}
	cmds[0].Process.Signal(syscall.SIGTERM)
	cmds[0].Wait()
	if nets := h.Status().Networks; len(nets) != 1 {
		t.Errorf("after the first helper: networks %+v, want it still up", nets)
	}
	cmds[1].Process.Signal(syscall.SIGTERM)
	cmds[1].Wait()
	testutil.Eventually(t, 20*time.Second, func() error {
		if out, _ := h.Run(context.Background(), "ip", "-br", "link"); strings.Contains(out, "vmn-") {
			return fmt.Errorf("bridges left: %s", out)
		}
		return nil
	}, "the network made on demand to go with its last helper")
}

// TestHelperKeepsNetworksOfRecord: a helper started on its own with
// another networks.yaml than the one the state dir's projects run with
// neither replaces it nor joins a network defined otherwise: it says so.
func TestHelperKeepsNetworksOfRecord(t *testing.T) {
	h := newHost(t)
	h.MustVmnetctl("up", "-f", h.WriteFile("vms.yaml", "vms:\n  a:\n    networks:\n      - vmnet: shared\n"))
	other := h.WriteFile("other.yaml", "vmnet:\n  shared:\n    subnet: 10.97.0.0/24\n")
	out, err := h.Run(context.Background(), h.Binary, "--state-dir", h.StateDir(), "--networks", other,
		"helper", "--network", "shared", "--socket", filepath.Join(h.Dir, "x.sock"))
	if err == nil || !strings.Contains(out, `network "shared" in force (`+h.Networks+`) is shared 10.77.0.0/24`) {
		t.Fatalf("helper with another definition of shared: %v\n%s", err, out)
	}
	snap, err := statedir.Dir{Path: h.StateDir()}.Networks()
	if err != nil || snap == nil || snap.Source != h.Networks {
		t.Errorf("networks of record after the helper: %v %v, want %s", snap != nil, err, h.Networks)
	}
}

// TestLeaseExpired: a lease that runs out without being renewed (the
// guest's udhcpc got it and quit) is a lease-expired event, with its VM,
// MAC and address; describe shows it as the last DHCP event.
func TestLeaseExpired(t *testing.T) {
	h := &host{Host: simvm.NewHost(t, "vmnh", strings.Replace(networksYAML, "    dhcpRange:", "    leaseTime: 10s\n    dhcpRange:", 1), "pgrep"), t: t}
	h.MustVmnetctl("up", "-f", h.WriteFile("vms.yaml", "vms:\n  a:\n    networks:\n      - vmnet: shared\n"))
	a := h.Attachment(h.Status(), "a")
	// Before the request: the client returns a second or more after the
	// ACK (it checks the address is free), so a time taken after it is no
	// bound on when the lease was granted. A lease's expiry is whole
	// seconds (leases: Truncate).
	asked := time.Now()
	ip := h.VM(a).DHCP(t)["ip"]
	var expired *ctlapi.Event
	testutil.Eventually(t, 30*time.Second, func() error {
		for _, line := range strings.Split(strings.TrimSpace(h.MustVmnetctl("events", "--json")), "\n") {
			var ev ctlapi.Event
			if json.Unmarshal([]byte(line), &ev) == nil && ev.Kind == "lease-expired" {
				expired = &ev
				return nil
			}
		}
		return errors.New("no lease-expired event")
	}, "the lease to expire")
	if expired.Attachment != "a/0" || expired.IP != ip || !strings.EqualFold(expired.MAC, a.MAC) || expired.Time.Before(asked.Add(10*time.Second).Truncate(time.Second)) {
		t.Errorf("lease-expired event %+v, want a/0's %s (%s), 10s after the lease was granted (asked for at %s)", expired, ip, a.MAC, asked.Format(time.RFC3339Nano))
	}
	var d ops.Description
	if err := json.Unmarshal([]byte(h.MustVmnetctl("describe", "a", "--json")), &d); err != nil {
		t.Fatal(err)
	}
	if l := d.Attachments[0].LastDHCP; l == nil || l.Kind != "lease-expired" || d.Attachments[0].Lease != nil {
		t.Errorf("describe a after its lease expired: last DHCP %+v, lease %+v", l, d.Attachments[0].Lease)
	}
}

// TestBridgedInterfaceMissing: validate and plan warn of a bridged
// network whose host interface does not exist, with the interfaces this
// host could bridge onto, before up fails on it.
func TestBridgedInterfaceMissing(t *testing.T) {
	h := &host{Host: simvm.NewHost(t, "vmnh", networksYAML+"  lan:\n    mode: bridged\n    interface: nosuch0\n", "pgrep"), t: t}
	h.MustRun(t, "ip", "link", "add", "lanbr0", "type", "bridge")
	vms := h.WriteFile("vms.yaml", "vms:\n  a:\n    networks:\n      - vmnet: lan\n")
	want := `network lan (vmnetctl): up would fail: network "lan": interface nosuch0 does not exist; interfaces this host could bridge onto: lanbr0`
	for _, args := range [][]string{{"validate"}, {"validate", "-f", vms}, {"plan", "-f", vms}} {
		out, err := h.VmnetctlCommand(context.Background(), args...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "warning: "+want) {
			t.Errorf("%v: %v\n%s\nwant the warning %q", args, err, out, want)
		}
	}
}
