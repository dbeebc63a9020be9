package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/backend/vmnethelper"
	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/ops"
	"github.com/vmnetctl/vmnetctl/procid"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// TestVMNetHelperBackend runs the whole controller with the macOS backend
// against a fake vmnet-helper (test/fakevmnethelper), on any OS, as any
// user: vmnet-helper is started per attachment with the network's flags,
// its socket is waited for, the frames a VM sends through it are counted in
// the status (exactly, each way; nothing before a VM connects), and it is
// stopped with SIGTERM when the project goes.
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
	t.Setenv("FAKE_VMNET_HELPER_MODE", "")
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
	c, err := New(Options{StateDir: sd, Backend: vmnethelper.Backend{Path: fake}, MetricsAddr: "off", StopGrace: 2 * time.Second, ExitWhenIdle: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- c.Run(ctx) }()
	cl := ops.NewClient(sd)
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
	if a.State != ctlapi.StateRunning || a.Socket != sd.SocketPath("dev", 0) || a.PID == 0 {
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
	// No VM yet, so no traffic: vmnet-helper reports stats only once it
	// serves a client, and counts only frames that passed.
	time.Sleep(300 * time.Millisecond) // several stats intervals
	if st, err := cl.Status(ctx); err != nil || st.Attachments[0].RxBytes != 0 || st.Attachments[0].TxBytes != 0 {
		t.Fatalf("traffic before any VM connected: %+v, %v", st.Attachments[0], err)
	}
	// Be the VM: connect to the socket as a VMM does (a bound socket of its
	// own, vfkit's 4-byte hello first, which vmnet-helper drops), send
	// frames and read them back (the fake vmnet mirrors each frame).
	vm, err := net.DialUnix("unixgram", &net.UnixAddr{Name: filepath.Join(dir, "vm.sock"), Net: "unixgram"}, &net.UnixAddr{Name: a.Socket, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Close()
	if _, err := vm.Write([]byte("VFKT")); err != nil {
		t.Fatal(err)
	}
	var sent uint64
	buf := make([]byte, 2048)
	for i, size := range []int{60, 342, 1514} {
		frame := make([]byte, size)
		copy(frame, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x52, 0x55, 0x55, 0x12, 0x34, 0x56, 0x88, 0xb5})
		frame[size-1] = byte(i)
		if _, err := vm.Write(frame); err != nil {
			t.Fatal(err)
		}
		vm.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := vm.Read(buf)
		if err != nil || !bytes.Equal(buf[:n], frame) {
			t.Fatalf("frame %d: read %d bytes, %v; want the %d sent back", i, n, err, size)
		}
		sent += uint64(size)
	}
	// Its stats lines reach the status, as with our helper: exactly what
	// passed, each way.
	for deadline := time.Now().Add(10 * time.Second); ; {
		st, err := cl.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		as := st.Attachments[0]
		if as.RxBytes == sent && as.TxBytes == sent && as.Drops == 0 {
			break
		}
		if as.RxBytes > sent || as.TxBytes > sent || time.Now().After(deadline) {
			t.Fatalf("status %+v, want %d bytes each way (rx from the VM, tx to it) and no drops", as, sent)
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
	if id, err := procid.Read(a.PID); err == nil && strings.Contains(strings.Join(id.Cmdline, " "), "vmnet-helper") {
		t.Errorf("vmnet-helper %d still runs", a.PID)
	}
}
