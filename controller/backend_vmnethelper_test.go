package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/helperexec"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// TestVMNetHelperBackend runs the whole controller with the macOS backend
// against a fake vmnet-helper (test/fakevmnethelper), on any OS, as any
// user: vmnet-helper is started per attachment with the network's flags,
// its socket is waited for, its stats reach the status, and it is stopped
// with SIGTERM when the project goes.
func TestVMNetHelperBackend(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("needs the go command to build the fake vmnet-helper")
	}
	dir := t.TempDir()
	fake := filepath.Join(dir, "vmnet-helper")
	if out, err := exec.Command("go", "build", "-o", fake, "github.com/vmnetctl/vmnetctl/test/fakevmnethelper").CombinedOutput(); err != nil {
		t.Fatalf("building the fake vmnet-helper: %v\n%s", err, out)
	}
	argvFile := filepath.Join(dir, "argv.json")
	t.Setenv("FAKE_VMNET_HELPER_MODE", "shared")
	t.Setenv("FAKE_VMNET_HELPER_ARGV", argvFile)
	t.Setenv("FAKE_VMNET_HELPER_TICK", "50ms")

	sd := statedir.Dir{Path: filepath.Join(dir, "state")}
	networks := []byte("networks:\n  shared:\n    mode: shared\n    gateway: 192.168.105.1\n    dhcpEnd: 192.168.105.254\n    netmask: 255.255.255.0\n")
	if err := sd.SaveNetworks(statedir.NetworksSnapshot{Source: "networks.yaml", Data: networks}); err != nil {
		t.Fatal(err)
	}
	p := &statedir.Project{Name: "dev", VMName: "dev", UID: os.Getuid(), GID: os.Getgid(),
		Files: []statedir.ProjectFile{{Path: "lima.yaml", Data: []byte("networks:\n  - vmnet: shared\n")}}}
	if err := sd.SaveProject(p); err != nil {
		t.Fatal(err)
	}
	c, err := New(Options{StateDir: sd, Backend: VMNetHelperBackend{Path: fake}, MetricsAddr: "off", StopGrace: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- c.Run(ctx) }()
	cl := NewClient(sd)
	deadline := time.Now().Add(10 * time.Second)
	for !cl.Running(ctx) {
		if time.Now().After(deadline) {
			t.Fatal("the controller did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
	resp, err := cl.Reconcile(ctx)
	if err != nil || resp.Error != "" {
		t.Fatalf("reconcile: %v %s", err, resp.Error)
	}
	a := resp.Status.Attachments[0]
	if a.State != StateRunning || a.Socket != sd.SocketPath("dev", 0) || a.PID == 0 {
		t.Fatalf("attachment = %+v", a)
	}
	if _, err := os.Stat(a.Socket); err != nil {
		t.Errorf("reported ready before its socket existed: %v", err)
	}
	var argv []string
	data, _ := os.ReadFile(argvFile)
	if err := json.Unmarshal(data, &argv); err != nil {
		t.Fatalf("argv file: %v (%s)", err, data)
	}
	got := strings.Join(argv[1:], " ")
	for _, want := range []string{"--socket " + a.Socket, "--operation-mode shared", "--start-address 192.168.105.1",
		"--end-address 192.168.105.254", "--subnet-mask 255.255.255.0", "--interface-id "} {
		if !strings.Contains(got, want) {
			t.Errorf("vmnet-helper ran with %q, want %q in it", got, want)
		}
	}
	if slices.Contains(argv, "helper") || slices.Contains(argv, "--network") {
		t.Errorf("vmnet-helper got vmnetctl helper's flags: %q", got)
	}
	// Its stats lines reach the status, as with our helper.
	for deadline := time.Now().Add(10 * time.Second); ; {
		st, err := cl.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Attachments[0].RxBytes > 0 && st.Attachments[0].TxBytes > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no stats after 10s: %+v", st.Attachments[0])
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Removing the project stops vmnet-helper (SIGTERM) and the controller.
	if _, err := sd.DeleteProject("dev"); err != nil {
		t.Fatal(err)
	}
	cl.Reconcile(ctx)
	select {
	case err := <-runErr:
		if err != nil {
			t.Fatalf("controller: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the controller did not exit after the last project went")
	}
	if id, err := helperexec.ReadProcIdentity(a.PID); err == nil && strings.Contains(strings.Join(id.Cmdline, " "), "vmnet-helper") {
		t.Errorf("vmnet-helper %d still runs", a.PID)
	}
}

func TestVMNetHelperBackendRefusesTap(t *testing.T) {
	_, err := VMNetHelperBackend{Path: "/x"}.HelperCommand(HelperSpec{Attachment: &Attachment{Attachment: tapAttachment()}})
	if err != ErrTapNeedsLinux {
		t.Errorf("tap attachment: %v", err)
	}
}

func tapAttachment() *api.Attachment {
	return &api.Attachment{VM: "fc", Attach: api.AttachTAP, MAC: "52:55:55:00:00:01"}
}

func TestVMNetHelperLeases(t *testing.T) {
	file := filepath.Join(t.TempDir(), "dhcpd_leases")
	exp := time.Now().Add(time.Hour).Unix()
	data := fmt.Sprintf("{\n\tname=web\n\tip_address=192.168.105.7\n\thw_address=1,52:55:55:1:2:3\n\tidentifier=1,52:55:55:1:2:3\n\tlease=0x%x\n}\n"+
		"{\n\tname=other\n\tip_address=192.168.64.9\n\thw_address=1,52:55:55:0:0:9\n\tidentifier=1,52:55:55:0:0:9\n\tlease=0x%x\n}\n", exp, exp)
	if err := os.WriteFile(file, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	nets, diags := api.LoadNetworks("n.yaml", []byte("vmnet:\n  shared:\n    subnet: 192.168.105.0/24\n"))
	if diags.HasErrors() {
		t.Fatal(diags.Err())
	}
	nw, err := VMNetHelperBackend{LeasesFile: file}.StartNetwork(context.Background(), nets.Get("shared"), "", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	leases := nw.Leases()
	if len(leases) != 1 || leases[0].MAC != "52:55:55:01:02:03" || leases[0].IP.String() != "192.168.105.7" || leases[0].Hostname != "web" {
		t.Errorf("leases = %+v, want web's only (the other is outside the subnet)", leases)
	}
}

func TestVMNetHelperSudoRefusesAUserOwnedHelper(t *testing.T) {
	fake := filepath.Join(t.TempDir(), "vmnet-helper")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		os.Chown(fake, 65534, 65534) // owned by nobody: not root's
	}
	nets, _ := api.LoadNetworks("n.yaml", []byte("vmnet:\n  shared:\n    subnet: 192.168.105.0/24\n"))
	a := &Attachment{Attachment: &api.Attachment{VM: "dev", MAC: "52:55:55:00:00:01", Attach: api.AttachSocket}}
	_, err := VMNetHelperBackend{Path: fake, Sudo: true}.HelperCommand(HelperSpec{Attachment: a, Network: nets.Get("shared"), Owner: &statedir.Project{}, Socket: "/tmp/x.sock", FD: -1})
	if err == nil {
		t.Fatal("a vmnet-helper that a user can replace would run as root")
	}
}

func TestVMNetHelperBrokerAndOffloads(t *testing.T) {
	nets, diags := api.LoadNetworks("n.yaml", []byte("vmnet:\n  shared:\n    subnet: 192.168.105.0/24\n    offloads: true\n  brokered:\n    subnet: 192.168.106.0/24\n    vmnetBroker: lima-shared\n"))
	if diags.HasErrors() {
		t.Fatal(diags.Err())
	}
	a := &Attachment{Attachment: &api.Attachment{VM: "dev", MAC: "52:55:55:00:00:01", Attach: api.AttachSocket}}
	b := VMNetHelperBackend{Path: "/opt/vmnet-helper/bin/vmnet-helper"}
	argv, err := b.HelperCommand(HelperSpec{Attachment: a, Network: nets.Get("shared"), Owner: &statedir.Project{}, Socket: "/tmp/x.sock", FD: -1})
	if got := strings.Join(argv, " "); err != nil || !strings.Contains(got, "--enable-tso") || !strings.Contains(got, "--enable-checksum-offload") {
		t.Errorf("offloads: %q %v", got, err)
	}
	argv, err = b.HelperCommand(HelperSpec{Attachment: a, Network: nets.Get("brokered"), Owner: &statedir.Project{}, Socket: "/tmp/x.sock", FD: -1})
	if got := strings.Join(argv, " "); err != nil || !strings.Contains(got, "--network lima-shared") || strings.Contains(got, "--operation-mode") {
		t.Errorf("broker network: %q %v", got, err)
	}
	argv, _ = linuxBackend{}.HelperCommand(HelperSpec{Executable: "vmnetctl", Attachment: a, Network: nets.Get("shared"), Owner: &statedir.Project{UID: -1}, Socket: "/tmp/x.sock", FD: -1})
	if got := strings.Join(argv, " "); !strings.Contains(got, "--enable-tso --enable-checksum-offload") {
		t.Errorf("our helper without offloads: %q", got)
	}
}
