//go:build unix

package vmnethelper

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
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
	r.cmd.Env = append(fakeEnv(), "FAKE_VMNET_HELPER_MODE="+mode, "FAKE_VMNET_HELPER_ARGV="+r.argvFile)
	r.cmd.Env = append(r.cmd.Env, env...)
	return r
}

// fakeEnv is the test's environment without sudo's ids (under `sudo go
// test` they name the user who ran sudo, and vmnet-helper, and so the fake,
// would drop to them) and without the fake's own variables.
func fakeEnv() []string {
	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "SUDO_") && !strings.HasPrefix(e, "FAKE_VMNET_HELPER_") {
			env = append(env, e)
		}
	}
	return env
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
	isUUID := func(t *testing.T, r helperproto.Ready) {
		if !api.ValidInterfaceID(r.InterfaceID) {
			t.Errorf("interface id %q is not a UUID", r.InterfaceID)
		}
	}
	tests := []struct {
		name  string
		opts  Options
		check func(t *testing.T, r helperproto.Ready)
	}{
		{"shared", Options{FD: -1, InterfaceID: id, Network: testNetwork(t, "shared")}, func(t *testing.T, r helperproto.Ready) {
			if r.InterfaceID != id || r.NAT66Prefix == "" || r.StartAddress.String() != "192.168.105.1" || r.EndAddress.String() != "192.168.105.254" || r.SubnetMask.String() != "255.255.255.0" {
				t.Errorf("shared ready = %+v", r)
			}
		}},
		{"host", Options{FD: -1, InterfaceID: id, Network: testNetwork(t, "host")}, func(t *testing.T, r helperproto.Ready) {
			if r.InterfaceID != id || r.NAT66Prefix != "" || r.StartAddress.String() != "192.168.106.1" || r.EndAddress.String() != "192.168.106.200" {
				t.Errorf("host ready = %+v", r)
			}
		}},
		// vmnet-helper takes --enable-isolation with shared as with host.
		{"shared isolation", Options{FD: -1, InterfaceID: id, Network: testNetwork(t, "isolated-shared")}, func(t *testing.T, r helperproto.Ready) {
			if r.InterfaceID != id || r.StartAddress.String() != "192.168.108.1" {
				t.Errorf("isolated shared ready = %+v", r)
			}
		}},
		{"bridged", Options{FD: -1, InterfaceID: id, Network: testNetwork(t, "bridged")}, func(t *testing.T, r helperproto.Ready) {
			if r.InterfaceID != id || r.StartAddress.IsValid() || r.NAT66Prefix != "" {
				t.Errorf("bridged ready = %+v, want no addresses", r)
			}
		}},
		// With --network vmnet picks the interface: no --interface-id.
		{"network", Options{FD: -1, InterfaceID: id, BrokerNetwork: "shared"}, func(t *testing.T, r helperproto.Ready) {
			isUUID(t, r)
			if !r.IPv4Subnet.IsValid() || !r.IPv4Mask.IsValid() || r.IPv6Prefix == "" || r.IPv6PrefixLen != 64 {
				t.Errorf("--network ready = %+v", r)
			}
		}},
		{"tso", Options{FD: -1, InterfaceID: id, Network: testNetwork(t, "isolated"), TSO: true, ChecksumOffload: true}, func(t *testing.T, r helperproto.Ready) {
			if r.InterfaceID != id || r.MaxPacketSize != 65550 {
				t.Errorf("TSO ready = %+v, want max packet size 65550", r)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// The socket comes late: Start must wait for it after the line.
			fr := fakeCommand(t, "", tt.opts, "FAKE_VMNET_HELPER_SOCKET_DELAY=200ms")
			h, err := helperexec.Start(context.Background(), fr.cmd, helperexec.StartOptions{SocketPath: fr.sock, StallTimeout: 10 * time.Second})
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
			if len(h.Ready.MACAddress) != 6 || h.Ready.MTU != 1500 {
				t.Errorf("ready = %+v", h.Ready)
			}
			tt.check(t, h.Ready)
			if got := fr.recordedArgv(t); !slices.Equal(got, fr.argv) {
				t.Errorf("the fake ran with %q, want %q", got, fr.argv)
			}
			if err := h.Stop(); err != nil {
				t.Errorf("Stop() = %v, want nil (exit 0 on SIGTERM)", err)
			}
			if strings.Contains(h.Tail(), "WARN") {
				t.Errorf("warnings from the command line Command built:\n%s", h.Tail())
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
	// With --fd there is no first datagram to drop: a frame comes back.
	frame := testFrame(100, 1)
	if _, err := vmEnd.Write(frame); err != nil {
		t.Fatal(err)
	}
	vmEnd.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 2048)
	n, err := vmEnd.Read(buf)
	if err != nil || !bytes.Equal(buf[:n], frame) {
		t.Errorf("read %d bytes, %v; want the frame back", n, err)
	}
	if err := h.Stop(); err != nil {
		t.Errorf("Stop() = %v", err)
	}
}

func TestVMNetHelperFakeHang(t *testing.T) {
	t.Parallel()
	fr := fakeCommand(t, "hang", Options{FD: -1, Network: testNetwork(t, "shared")})
	start := time.Now()
	_, err := helperexec.Start(context.Background(), fr.cmd, helperexec.StartOptions{SocketPath: fr.sock, StallTimeout: 300 * time.Millisecond})
	if err == nil {
		t.Fatal("Start of a hanging helper succeeded")
	}
	if !strings.Contains(err.Error(), "made no progress for 300ms") || !strings.Contains(err.Error(), "INFO  [main] using bulk_forwarding: false") {
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
	for _, want := range []string{"exited before it was ready", "exit status 1", "ERROR [main] vmnet_start_interface: VMNET_FAILURE"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error = %v, want it to contain %q", err, want)
		}
	}
}

// testFrame is an Ethernet frame of size bytes: broadcast, from a local
// MAC, an experimental ethertype, the payload filled with seq.
func testFrame(size int, seq byte) []byte {
	f := make([]byte, size)
	copy(f, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x52, 0x55, 0x55, 0x12, 0x34, 0x56, 0x88, 0xb5})
	for i := 14; i < size; i++ {
		f[i] = seq
	}
	return f
}

// dialFake connects to a helper's --socket as a VMM does: a bound unixgram
// socket of its own, connected to the helper's, with vfkit's 4-byte hello
// first (vmnet-helper drops a first datagram shorter than 64 bytes).
func dialFake(t *testing.T, sock string) *net.UnixConn {
	t.Helper()
	local := filepath.Join(t.TempDir(), "vm.sock")
	c, err := net.DialUnix("unixgram", &net.UnixAddr{Name: local, Net: "unixgram"}, &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Write([]byte("VFKT")); err != nil {
		t.Fatal(err)
	}
	return c
}

// exchange sends frames of the given sizes and reads each back; it returns
// the bytes sent.
func exchange(t *testing.T, c *net.UnixConn, sizes ...int) uint64 {
	t.Helper()
	var total uint64
	buf := make([]byte, 65536)
	for i, size := range sizes {
		f := testFrame(size, byte(i))
		if _, err := c.Write(f); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if !bytes.Equal(buf[:n], f) {
			t.Fatalf("frame %d: got %d bytes back, want the %d sent", i, n, size)
		}
		total += uint64(size)
	}
	return total
}

func TestVMNetHelperFakeStats(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []helperproto.Stats
	fr := fakeCommand(t, "", Options{FD: -1, Network: testNetwork(t, "shared"), StatsInterval: time.Second}, "FAKE_VMNET_HELPER_TICK=20ms")
	h, err := helperexec.Start(context.Background(), fr.cmd, helperexec.StartOptions{SocketPath: fr.sock, OnStats: func(s helperproto.Stats) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, s)
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Stop()
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(got)
	}
	// No client, no stats: vmnet-helper starts its stats timer only once it
	// serves a client.
	time.Sleep(300 * time.Millisecond) // 15 ticks
	if n := count(); n != 0 {
		t.Fatalf("%d stats lines before a client connected: %+v", n, got)
	}

	c := dialFake(t, fr.sock)
	sent := exchange(t, c, 64, 300, 1514)
	// The counters are the frames that passed: 3 each way, the hello not
	// among them.
	var last helperproto.Stats
	for deadline := time.Now().Add(10 * time.Second); ; {
		mu.Lock()
		if len(got) > 0 {
			last = got[len(got)-1]
		}
		mu.Unlock()
		if last.VM.Packets == 3 && last.Host.Packets == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stats never counted 3 frames each way: %+v", last)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if last.VM.Bytes != sent || last.Host.Bytes != sent || last.VM.Drops != 0 || last.Host.Drops != 0 {
		t.Errorf("stats = %+v, want %d bytes each way and no drops", last, sent)
	}
	// The slow path: a write per frame to the VM, a read per frame from it
	// (plus the one waiting for the next).
	if last.Host.Slow != 3 || last.VM.Slow != 4 || last.Host.Fast != 0 || last.VM.Fast != 0 {
		t.Errorf("stats = %+v, want 3 slow writes and 4 slow reads", last)
	}
	mu.Lock()
	for i := 1; i < len(got); i++ {
		if got[i].VM.Packets < got[i-1].VM.Packets || got[i].Host.Bytes < got[i-1].Host.Bytes {
			t.Errorf("stats %d %+v go back from %+v", i, got[i], got[i-1])
		}
		if got[i].Time.Before(got[i-1].Time) {
			t.Errorf("stats %d time goes back", i)
		}
	}
	mu.Unlock()
	if strings.Contains(h.Tail(), "[stats]") {
		t.Errorf("stats lines in the tail: %s", h.Tail())
	}
}

// Without --stats-interval vmnet-helper logs no stats, whatever flows.
func TestVMNetHelperFakeNoStatsWithoutInterval(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	lines := 0
	fr := fakeCommand(t, "", Options{FD: -1, Network: testNetwork(t, "shared")}, "FAKE_VMNET_HELPER_TICK=20ms")
	h, err := helperexec.Start(context.Background(), fr.cmd, helperexec.StartOptions{SocketPath: fr.sock, OnStats: func(helperproto.Stats) {
		mu.Lock()
		lines++
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Stop()
	exchange(t, dialFake(t, fr.sock), 100)
	time.Sleep(300 * time.Millisecond)
	if err := h.Stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if lines != 0 {
		t.Errorf("%d stats lines without --stats-interval", lines)
	}
}

// A zero-length datagram is the peer closing, for vmnet-helper: it stops
// (exit 0); a frame shorter than an Ethernet header fails vmnet_write
// (exit 1).
func TestVMNetHelperFakeClientEnds(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name     string
		datagram []byte
		wantErr  bool
		wantLog  string
	}{
		{"empty datagram", nil, false, "INFO  [vm->host] socket was closed by peer"},
		{"runt frame", []byte("VFKT"), true, "ERROR [vm->host] vmnet_write: VMNET_INVALID_ARGUMENT"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fr := fakeCommand(t, "", Options{FD: -1, Network: testNetwork(t, "shared")})
			h, err := helperexec.Start(context.Background(), fr.cmd, helperexec.StartOptions{SocketPath: fr.sock})
			if err != nil {
				t.Fatal(err)
			}
			defer h.Stop()
			c := dialFake(t, fr.sock)
			if _, err := c.Write(tt.datagram); err != nil {
				t.Fatal(err)
			}
			select {
			case <-h.Done():
			case <-time.After(5 * time.Second):
				t.Fatal("the helper did not stop")
			}
			if err := h.Wait(); (err != nil) != tt.wantErr {
				t.Errorf("Wait() = %v, want an error: %v", err, tt.wantErr)
			}
			if !strings.Contains(h.Tail(), tt.wantLog) {
				t.Errorf("log:\n%s\nwant %q", h.Tail(), tt.wantLog)
			}
		})
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
	if !strings.Contains(string(b), "INFO  [main] received signal Terminated\n") || !strings.Contains(string(b), "INFO  [main] stopped vmnet interface\n") {
		t.Errorf("log file:\n%s", b)
	}
}

// As root, vmnet-helper drops to $SUDO_UID/$SUDO_GID once the interface is
// up and only then creates its socket, so the socket is the user's because
// the process is; the fake does the same (it does not chown anything). The
// socket's directory must let the user in, as a user's directory on a Mac
// does.
func TestVMNetHelperFakeDropsPrivileges(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to drop privileges")
	}
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} { // the test's temporary directories: root's, 0700
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	userDir := filepath.Join(dir, "user")
	if err := os.Mkdir(userDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(userDir, 4321, 4322); err != nil {
		t.Fatal(err)
	}
	o := Options{FD: -1, Socket: filepath.Join(userDir, "0.sock"), Network: testNetwork(t, "shared")}
	fr := fakeCommand(t, "", o, "SUDO_UID=4321", "SUDO_GID=4322")
	h, err := helperexec.Start(context.Background(), fr.cmd, helperexec.StartOptions{SocketPath: fr.sock})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Stop()
	for _, p := range []string{fr.sock, fr.sock + ".lock"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != 4321 || st.Gid != 4322 {
			t.Errorf("%s owned by %d:%d, want 4321:4322 ($SUDO_UID:$SUDO_GID)", p, st.Uid, st.Gid)
		}
	}
	// The process itself runs as the user now (Linux shows it in /proc).
	if status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", h.Pid())); err == nil {
		if !strings.Contains(string(status), "\nUid:\t4321\t4321\t4321\t4321\n") || !strings.Contains(string(status), "\nGid:\t4322\t4322\t4322\t4322\n") {
			t.Errorf("the helper did not drop its privileges:\n%s", status)
		}
	}
	if err := h.Stop(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"running as uid: 0 gid: 0", "dropped privileges to uid: 4321 gid: 4322"} {
		if !strings.Contains(h.Tail(), want) {
			t.Errorf("log:\n%s\nwant %q", h.Tail(), want)
		}
	}
	if _, err := os.Stat(fr.sock); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the user's helper left its socket behind: %v", err)
	}
}

// The fake refuses what vmnet-helper's programs/options.c refuses, with its
// messages (no [main]: parse_options logs without a component), and takes
// what it takes, so a wrong command line fails here as it would on a Mac.
func TestFakeVMNetHelperRejects(t *testing.T) {
	path := fakeVMNetHelper(t)
	// A socket path that is harmless if a line is wrongly taken.
	x := filepath.Join(t.TempDir(), "x")
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--socket", x, "--bogus"}, "ERROR Invalid option: --bogus\n"},
		{[]string{"--socket"}, "ERROR Option --socket requires an argument\n"},
		{[]string{"--operation-mode", "shared"}, `ERROR Missing argument: either "fd" or "socket" required` + "\n"},
		{[]string{"--fd", "3", "--socket", x}, `ERROR Conflicting arguments: "fd" and "socket" are mutually exclusive` + "\n"},
		{[]string{"--fd", "3x"}, "ERROR Invalid fd '3x'\n"},
		{[]string{"--socket", "/" + strings.Repeat("x", 103)}, "too long (104 > 103)\n"},
		{[]string{"--socket", x, "--operation-mode", "bridged", "--shared-interface", "en0", "--enable-isolation"}, "ERROR Conflicting arguments: enable-isolation cannot be used with bridged mode\n"},
		{[]string{"--socket", x, "--operation-mode", "bridged"}, "ERROR Missing argument: shared-interface is required for operation-mode=bridged\n"},
		{[]string{"--socket", x, "--operation-mode", "nat"}, `ERROR Invalid --operation-mode: "nat"` + "\n"},
		{[]string{"--socket", x, "--start-address", "192.168.105.1"}, "ERROR --start-address, --end-address, and --subnet-mask must be given together, or all omitted\n"},
		{[]string{"--socket", x, "--start-address", "192.168.105.300"}, `ERROR Invalid --start-address: "192.168.105.300"` + "\n"},
		{[]string{"--socket", x, "--network", "shared", "--operation-mode", "host"}, "ERROR Conflicting arguments: --network cannot be used with --operation-mode\n"},
		{[]string{"--socket", x, "--network", "shared", "--subnet-mask", "255.255.255.0"}, "ERROR Conflicting arguments: --network cannot be used with --subnet-mask\n"},
		{[]string{"--socket", x, "--interface-id", "nope"}, `ERROR Invalid interface-id: "nope"` + "\n"},
		{[]string{"--socket", x, "--stats-interval", "1.5"}, "ERROR Invalid --stats value '1.5': must be a positive integer\n"},
		{[]string{"--socket", x, "--stats-interval", "0"}, "ERROR Invalid --stats value '0': must be a positive integer\n"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			// A line wrongly taken starts a helper that waits for a client:
			// fail in seconds, not at the test timeout.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, path, tt.args...)
			cmd.Env = fakeEnv()
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
			if !strings.HasPrefix(stderr.String(), "ERROR ") || !strings.Contains(stderr.String(), tt.want) {
				t.Errorf("stderr = %q, want an ERROR line containing %q", stderr.String(), tt.want)
			}
		})
	}
}

// What vmnet-helper's programs/options.c takes, the fake takes: isolation
// with shared and host, the address options with bridged (helper.c then
// leaves them out: vmnet gets none), --opt=value, unambiguous prefixes,
// arguments that are not options (ignored).
func TestFakeVMNetHelperAccepts(t *testing.T) {
	path := fakeVMNetHelper(t)
	tests := []struct {
		name string
		args []string
		want func(helperproto.Ready) bool
	}{
		{"shared isolation", []string{"--operation-mode", "shared", "--enable-isolation"}, func(r helperproto.Ready) bool { return r.NAT66Prefix != "" }},
		{"default mode isolation", []string{"--enable-isolation"}, func(r helperproto.Ready) bool { return r.NAT66Prefix != "" }},
		{"host isolation", []string{"--operation-mode=host", "--enable-isolation"}, func(r helperproto.Ready) bool { return r.StartAddress.IsValid() && r.NAT66Prefix == "" }},
		{"bridged with addresses", []string{"--operation-mode", "bridged", "--shared-interface", "en0", "--start-address", "10.0.0.1"},
			func(r helperproto.Ready) bool { return !r.StartAddress.IsValid() }},
		{"prefixes and extra arguments", []string{"--oper", "host", "--start-address", "10.1.0.1", "--end", "10.1.0.9", "--subnet-m", "255.255.0.0", "extra"},
			func(r helperproto.Ready) bool { return r.EndAddress.String() == "10.1.0.9" }},
		{"network and isolation", []string{"--network", "shared", "--enable-isolation"}, func(r helperproto.Ready) bool { return r.IPv4Subnet.IsValid() }},
	}
	// With --network, vmnet-helper ignores --interface-id, and says so.
	const id = "2835E074-9892-4A79-AFFB-7E41D2605678"
	tests = append(tests, struct {
		name string
		args []string
		want func(helperproto.Ready) bool
	}{"network ignores interface-id", []string{"--network", "shared", "--interface-id", id}, func(r helperproto.Ready) bool { return r.InterfaceID != id }})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sock := filepath.Join(t.TempDir(), "0.sock")
			cmd := exec.Command(path, append([]string{"--socket", sock}, tt.args...)...)
			cmd.Env = fakeEnv()
			h, err := helperexec.Start(context.Background(), cmd, helperexec.StartOptions{SocketPath: sock})
			if err != nil {
				t.Fatal(err)
			}
			defer h.Stop()
			if !tt.want(h.Ready) {
				t.Errorf("ready = %+v", h.Ready)
			}
			if err := h.Stop(); err != nil {
				t.Error(err)
			}
			warned := strings.Contains(h.Tail(), "WARN  [main] --interface-id is ignored with --network\n")
			if want := slices.Contains(tt.args, "--interface-id"); warned != want {
				t.Errorf("warned about --interface-id: %v, want %v; log:\n%s", warned, want, h.Tail())
			}
		})
	}
}
