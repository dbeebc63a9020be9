//go:build unix

package vmnethelper

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/helperexec"
	"github.com/vmnetctl/vmnetctl/helperproto"
)

// These tests drive Start with commands from Command against
// test/fakevmnethelper, a fake vmnet-helper, built once per source version.

var (
	fakeOnce sync.Once
	fakePath string
	fakeErr  error
)

func fakeVMNetHelper(t *testing.T) string {
	t.Helper()
	fakeOnce.Do(func() {
		src := filepath.Join("..", "..", "test", "fakevmnethelper", "main.go")
		data, err := os.ReadFile(src)
		if err != nil {
			fakeErr = err
			return
		}
		goBin, err := exec.LookPath("go")
		if err != nil {
			fakeErr = err
			return
		}
		// Keyed by the source, so repeated runs reuse one build and no
		// temporary directory is left per run.
		sum := sha256.Sum256(data)
		dir := filepath.Join(os.TempDir(), fmt.Sprintf("vmnetctl-fakevmnethelper-%x", sum[:6]))
		fakePath = filepath.Join(dir, "vmnet-helper")
		if _, err := os.Stat(fakePath); err == nil {
			return
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			fakeErr = err
			return
		}
		tmp := fmt.Sprintf("%s.%d", fakePath, os.Getpid())
		out, err := exec.Command(goBin, "build", "-o", tmp, "../../test/fakevmnethelper").CombinedOutput()
		if err != nil {
			fakeErr = fmt.Errorf("go build ./test/fakevmnethelper: %v\n%s", err, out)
			return
		}
		fakeErr = os.Rename(tmp, fakePath) // atomic against a parallel run
	})
	if fakeErr != nil {
		if errors.Is(fakeErr, exec.ErrNotFound) {
			t.Skipf("no go tool to build the fake vmnet-helper: %v", fakeErr)
		}
		t.Fatal(fakeErr)
	}
	return fakePath
}

type fakeRun struct {
	argv     []string
	argvFile string
	sock     string
	cmd      *exec.Cmd
}

// fakeCommand builds the fake's command line with Command: o's
// Path and, unless o.FD is set, Socket are filled in.
func fakeCommand(t *testing.T, mode string, o Options, env ...string) *fakeRun {
	t.Helper()
	dir := t.TempDir()
	r := &fakeRun{argvFile: filepath.Join(dir, "argv.json")}
	o.Path = fakeVMNetHelper(t)
	if o.FD < 0 && o.Socket == "" {
		o.Socket = filepath.Join(dir, "0.sock")
	}
	r.sock = o.Socket
	argv, err := Command(o)
	if err != nil {
		t.Fatal(err)
	}
	r.argv = argv
	r.cmd = exec.Command(argv[0], argv[1:]...)
	r.cmd.Env = append(os.Environ(), "FAKE_VMNET_HELPER_MODE="+mode, "FAKE_VMNET_HELPER_ARGV="+r.argvFile)
	r.cmd.Env = append(r.cmd.Env, env...)
	return r
}

func (r *fakeRun) recordedArgv(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(r.argvFile)
	if err != nil {
		t.Fatal(err)
	}
	var argv []string
	if err := json.Unmarshal(b, &argv); err != nil {
		t.Fatal(err)
	}
	return argv
}

func TestVMNetHelperFakeReady(t *testing.T) {
	id := api.InterfaceID("vm1", 0, "52:55:55:12:34:56")
	tests := []struct {
		name  string
		mode  string
		opts  Options
		check func(t *testing.T, r helperproto.Ready)
	}{
		{"shared", "shared", Options{FD: -1, InterfaceID: id, Network: testNetwork(t, "shared")}, func(t *testing.T, r helperproto.Ready) {
			if r.NAT66Prefix == "" || r.StartAddress.String() != "192.168.105.1" || r.EndAddress.String() != "192.168.105.254" || r.SubnetMask.String() != "255.255.255.0" {
				t.Errorf("shared ready = %+v", r)
			}
		}},
		{"host", "host", Options{FD: -1, InterfaceID: id, Network: testNetwork(t, "host")}, func(t *testing.T, r helperproto.Ready) {
			if r.NAT66Prefix != "" || r.StartAddress.String() != "192.168.106.1" || r.EndAddress.String() != "192.168.106.200" {
				t.Errorf("host ready = %+v", r)
			}
		}},
		{"network", "network", Options{FD: -1, InterfaceID: id, BrokerNetwork: "shared"}, func(t *testing.T, r helperproto.Ready) {
			if !r.IPv4Subnet.IsValid() || !r.IPv4Mask.IsValid() || r.IPv6Prefix == "" || r.IPv6PrefixLen != 64 {
				t.Errorf("--network ready = %+v", r)
			}
		}},
		{"tso", "", Options{FD: -1, InterfaceID: id, Network: testNetwork(t, "isolated"), TSO: true, ChecksumOffload: true}, func(t *testing.T, r helperproto.Ready) {
			if r.MaxPacketSize != 65550 {
				t.Errorf("TSO max packet size = %d", r.MaxPacketSize)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// The socket comes late: Start must wait for it after the line.
			fr := fakeCommand(t, tt.mode, tt.opts, "FAKE_VMNET_HELPER_SOCKET_DELAY=200ms")
			h, err := helperexec.Start(context.Background(), fr.cmd, helperexec.StartOptions{SocketPath: fr.sock, ReadyTimeout: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer h.Stop()
			fi, err := os.Stat(fr.sock)
			if err != nil {
				t.Fatalf("Start returned before the socket exists: %v", err)
			}
			if fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o600 {
				t.Errorf("socket mode = %v, want a socket with 0600", fi.Mode())
			}
			if len(h.Ready.MACAddress) != 6 || h.Ready.MTU != 1500 || h.Ready.InterfaceID != id {
				t.Errorf("ready = %+v", h.Ready)
			}
			tt.check(t, h.Ready)
			if got := fr.recordedArgv(t); !slices.Equal(got, fr.argv) {
				t.Errorf("the fake ran with %q, want %q", got, fr.argv)
			}
			if err := h.Stop(); err != nil {
				t.Errorf("Stop() = %v, want nil (exit 0 on SIGTERM)", err)
			}
			if _, err := os.Stat(fr.sock); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("socket left behind after SIGTERM: %v", err)
			}
		})
	}
}

func TestVMNetHelperFakeSameIDSameMAC(t *testing.T) {
	o := Options{FD: -1, InterfaceID: api.InterfaceID("vm1", 0, "52:55:55:12:34:56"), Network: testNetwork(t, "shared")}
	var macs []string
	for range 2 {
		fr := fakeCommand(t, "", o)
		h, err := helperexec.Start(context.Background(), fr.cmd, helperexec.StartOptions{SocketPath: fr.sock})
		if err != nil {
			t.Fatal(err)
		}
		macs = append(macs, h.Ready.MACAddress.String())
		h.Stop()
	}
	if macs[0] != macs[1] {
		t.Errorf("one interface id gave MACs %v", macs)
	}
}

func TestVMNetHelperFakeFD(t *testing.T) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	helperEnd := os.NewFile(uintptr(fds[0]), "helper")
	vmEnd := os.NewFile(uintptr(fds[1]), "vm")
	defer vmEnd.Close()
	fr := fakeCommand(t, "", Options{FD: 3, Network: testNetwork(t, "host")})
	fr.cmd.ExtraFiles = []*os.File{helperEnd} // fd 3 in the child
	h, err := helperexec.Start(context.Background(), fr.cmd, helperexec.StartOptions{})
	helperEnd.Close()
	if err != nil {
		t.Fatal(err)
	}
	if h.Ready.StartAddress.String() != "192.168.106.1" {
		t.Errorf("ready = %+v", h.Ready)
	}
	if err := h.Stop(); err != nil {
		t.Errorf("Stop() = %v", err)
	}
}

func TestVMNetHelperFakeHang(t *testing.T) {
	t.Parallel()
	fr := fakeCommand(t, "hang", Options{FD: -1, Network: testNetwork(t, "shared")})
	start := time.Now()
	_, err := helperexec.Start(context.Background(), fr.cmd, helperexec.StartOptions{SocketPath: fr.sock, ReadyTimeout: 300 * time.Millisecond})
	if err == nil {
		t.Fatal("Start of a hanging helper succeeded")
	}
	if !strings.Contains(err.Error(), "not ready after 300ms") || !strings.Contains(err.Error(), "INFO  [main] starting vmnet interface") {
		t.Errorf("error = %v, want the timeout and the helper's stderr", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Start took %v", d)
	}
}

func TestVMNetHelperFakeFail(t *testing.T) {
	t.Parallel()
	fr := fakeCommand(t, "fail", Options{FD: -1, Network: testNetwork(t, "shared")})
	_, err := helperexec.Start(context.Background(), fr.cmd, helperexec.StartOptions{SocketPath: fr.sock})
	if err == nil {
		t.Fatal("Start of a failing helper succeeded")
	}
	for _, want := range []string{"exited before it was ready", "exit status 1", "ERROR [main] Failed to start interface: VMNET_FAILURE"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error = %v, want it to contain %q", err, want)
		}
	}
}

func TestVMNetHelperFakeStats(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []helperproto.Stats
	enough := make(chan struct{})
	fr := fakeCommand(t, "", Options{FD: -1, Network: testNetwork(t, "shared"), StatsInterval: time.Second}, "FAKE_VMNET_HELPER_TICK=20ms")
	h, err := helperexec.Start(context.Background(), fr.cmd, helperexec.StartOptions{SocketPath: fr.sock, OnStats: func(s helperproto.Stats) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, s)
		if len(got) == 3 {
			close(enough)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Stop()
	select {
	case <-enough:
	case <-time.After(10 * time.Second):
		t.Fatal("fewer than 3 stats lines in 10s")
	}
	mu.Lock()
	defer mu.Unlock()
	for i := 1; i < len(got); i++ {
		if got[i].Host.Packets <= got[i-1].Host.Packets || got[i].VM.Bytes <= got[i-1].VM.Bytes {
			t.Errorf("stats %d %+v do not grow from %+v", i, got[i], got[i-1])
		}
		if got[i].Time.Before(got[i-1].Time) {
			t.Errorf("stats %d time goes back", i)
		}
	}
	if strings.Contains(h.Tail(), "[stats]") {
		t.Errorf("stats lines in the tail: %s", h.Tail())
	}
}

func TestVMNetHelperFakeIgnoreTerm(t *testing.T) {
	t.Parallel()
	fr := fakeCommand(t, "ignore-term", Options{FD: -1, Network: testNetwork(t, "shared")})
	h, err := helperexec.Start(context.Background(), fr.cmd, helperexec.StartOptions{SocketPath: fr.sock, StopGrace: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = h.Stop()
	if err == nil || !strings.Contains(err.Error(), "ignored SIGTERM") {
		t.Errorf("Stop() = %v, want the SIGKILL escalation reported", err)
	}
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Errorf("Stop returned after %v, before the grace period", d)
	}
	select {
	case <-h.Done():
	default:
		t.Error("helper still running after Stop")
	}
}

func TestVMNetHelperFakeFileMode(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fr := fakeCommand(t, "", Options{FD: -1, Network: testNetwork(t, "shared"), StatsInterval: time.Second}, "FAKE_VMNET_HELPER_TICK=20ms")
	h, err := helperexec.Start(context.Background(), fr.cmd, helperexec.StartOptions{SocketPath: fr.sock,
		ReadyFile: filepath.Join(dir, "vm1.0.json"), LogFile: filepath.Join(dir, "vm1.0.log")})
	if err != nil {
		t.Fatal(err)
	}
	if h.Ready.NAT66Prefix == "" {
		t.Errorf("ready = %+v", h.Ready)
	}
	if err := h.Stop(); err != nil {
		t.Errorf("Stop() = %v", err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "vm1.0.log"))
	if !strings.Contains(string(b), "INFO  [main] helper terminated") {
		t.Errorf("log file:\n%s", b)
	}
}

func TestVMNetHelperFakeSocketOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give the socket away")
	}
	fr := fakeCommand(t, "", Options{FD: -1, Network: testNetwork(t, "shared")}, "SUDO_UID=4321", "SUDO_GID=4322")
	h, err := helperexec.Start(context.Background(), fr.cmd, helperexec.StartOptions{SocketPath: fr.sock})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Stop()
	fi, err := os.Stat(fr.sock)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 4321 || st.Gid != 4322 {
		t.Errorf("socket owned by %d:%d, want 4321:4322 ($SUDO_UID:$SUDO_GID)", st.Uid, st.Gid)
	}
	if err := h.Stop(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(h.Tail(), "running as uid: 4321 gid: 4322") {
		t.Errorf("log:\n%s", h.Tail())
	}
}

// The fake is as strict as vmnet-helper, so a wrong command line fails here
// as it would on a Mac.
func TestFakeVMNetHelperRejects(t *testing.T) {
	path := fakeVMNetHelper(t)
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--socket", "/x", "--bogus"}, "flag provided but not defined"},
		{[]string{"--operation-mode", "shared"}, `either "fd" or "socket" required`},
		{[]string{"--fd", "3", "--socket", "/x"}, "mutually exclusive"},
		{[]string{"--socket", "/x", "--operation-mode", "shared", "--enable-isolation"}, "enable-isolation requires operation-mode=host"},
		{[]string{"--socket", "/x", "--operation-mode", "bridged"}, "shared-interface is required"},
		{[]string{"--socket", "/x", "--start-address", "192.168.105.1"}, "must be specified together"},
		{[]string{"--socket", "/x", "--network", "shared", "--operation-mode", "host"}, "network and operation-mode are mutually exclusive"},
		{[]string{"--socket", "/x", "--interface-id", "nope"}, "Invalid interface-id"},
		{[]string{"--socket", "/x", "--stats-interval", "1.5"}, "Invalid stats-interval"},
		{[]string{"--socket", "/x", "extra"}, "unexpected argument"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			cmd := exec.Command(path, tt.args...)
			cmd.Env = append(os.Environ(), "FAKE_VMNET_HELPER_MODE=")
			var stdout, stderr strings.Builder
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Fatalf("exit = %v, want status 1", err)
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout = %q, want empty", stdout.String())
			}
			if !strings.HasPrefix(stderr.String(), "ERROR [main] ") || !strings.Contains(stderr.String(), tt.want) {
				t.Errorf("stderr = %q, want an ERROR line containing %q", stderr.String(), tt.want)
			}
		})
	}
}
