package helper_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/config"
	"github.com/vmnetctl/vmnetctl/guard"
	"github.com/vmnetctl/vmnetctl/helper"
	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/netplane"
	"github.com/vmnetctl/vmnetctl/relay"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// The tests run the real binary, as root, in network namespaces they create
// and remove: a "host" namespace with the network's bridge (named and marked
// as the data plane would) and a "vm" namespace with a TAP whose frames a
// small relay moves to and from the helper's socket, as qemu's -netdev
// dgram would.

var vmnetctlBin string

// runAsController: launch gives the helper's command line as the
// controller does (backend/linuxnet.HelperCommand: "helper" first, then
// --networks), which vmnetctl-helper takes as well.
var runAsController bool

func TestMain(m *testing.M) { testutil.MainWithVmnetctl(m, &vmnetctlBin) }

const (
	netID    = "shared"
	gateway  = "192.168.105.1"
	vmAddr   = "192.168.105.50"
	ownerID  = 65534 // nobody
	networks = "networks:\n  shared:\n    mode: shared\n    gateway: 192.168.105.1\n    dhcpEnd: 192.168.105.254\n    netmask: 255.255.255.0\n"
)

type fixture struct {
	host, vm *testutil.NS
	bridge   string
	networks string // networks.yaml
	dir      string
}

// newFixture creates the namespaces and the network's bridge.
func newFixture(t *testing.T) *fixture {
	t.Helper()
	testutil.RequireRoot(t, "creates network namespaces, bridges and TAPs")
	testutil.RequireCommands(t, "ip", "ping")
	f := &fixture{
		host:   testutil.NewNS(t, "vmnh-host"),
		vm:     testutil.NewNS(t, "vmnh-vm"),
		bridge: api.BridgeName(netID),
		dir:    t.TempDir(),
	}
	for _, ns := range []*testutil.NS{f.host, f.vm} {
		// No IPv6: no spontaneous traffic, so counters can be compared exactly.
		ns.MustRun(t, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
	}
	f.host.MustRun(t, "ip", "link", "add", f.bridge, "type", "bridge")
	f.host.MustRun(t, "ip", "link", "set", f.bridge, "alias", "vmnetctl:network="+netID)
	f.host.MustRun(t, "ip", "addr", "add", gateway+"/24", "dev", f.bridge)
	f.host.MustRun(t, "ip", "link", "set", f.bridge, "up")
	f.networks = filepath.Join(f.dir, "networks.yaml")
	if err := os.WriteFile(f.networks, []byte(networks), 0o644); err != nil {
		t.Fatal(err)
	}
	// The helper runs as nobody after setup: its socket directory must be
	// nobody's.
	if err := os.Chown(f.dir, ownerID, ownerID); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Dir(f.dir), 0o711); err != nil {
		t.Fatal(err)
	}
	return f
}

// openTap creates a TAP in namespace ns and returns its fd.
func openTap(t *testing.T, ns *testutil.NS, name string, vnetHdr bool, offloads int) *os.File {
	t.Helper()
	var fd int
	err := ns.Do(func() error {
		var err error
		fd, err = unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			return err
		}
		ifr, _ := unix.NewIfreq(name)
		flags := uint16(unix.IFF_TAP | unix.IFF_NO_PI)
		if vnetHdr {
			flags |= unix.IFF_VNET_HDR
		}
		ifr.SetUint16(flags)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			return fmt.Errorf("TUNSETIFF %s: %w", name, err)
		}
		if vnetHdr {
			if err := unix.IoctlSetPointerInt(fd, unix.TUNSETVNETHDRSZ, helper.VirtioNetHdrLen); err != nil {
				return err
			}
			if err := unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, offloads); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), name)
	t.Cleanup(func() { f.Close() })
	return f
}

// vmRelay plays the VMM: it moves frames between the VM's TAP and the
// helper's socket, counting what it moved.
type vmRelay struct {
	tap      *os.File
	conn     io.ReadWriteCloser
	sent     atomic.Uint64 // bytes sent to the helper (VM → host), without header
	received atomic.Uint64 // bytes received from the helper (host → VM)
	hdr      int
	wg       sync.WaitGroup
}

func startRelay(tap *os.File, conn io.ReadWriteCloser, hdr int) *vmRelay {
	r := &vmRelay{tap: tap, conn: conn, hdr: hdr}
	r.wg.Add(2)
	go func() {
		defer r.wg.Done()
		buf := make([]byte, 70000)
		for {
			n, err := tap.Read(buf)
			if err != nil {
				return
			}
			if _, err := conn.Write(buf[:n]); err != nil {
				if errors.Is(err, net.ErrClosed) || errors.Is(err, os.ErrClosed) {
					return
				}
				continue // helper gone or slow: a real VMM drops too
			}
			r.sent.Add(uint64(n - hdr))
		}
	}()
	go func() {
		defer r.wg.Done()
		buf := make([]byte, 70000)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			r.received.Add(uint64(n - hdr))
			tap.Write(buf[:n])
		}
	}()
	return r
}

// stop ends the relay and closes its end of the socket.
func (r *vmRelay) stop() {
	r.conn.Close()
	r.tap.Close()
	r.wg.Wait()
}

// setupVM configures the VM's TAP: the helper's MAC, a static address.
func (f *fixture) setupVM(t *testing.T, tap string, mac net.HardwareAddr) {
	t.Helper()
	f.vm.MustRun(t, "ip", "link", "set", tap, "address", mac.String())
	f.vm.MustRun(t, "ip", "addr", "add", vmAddr+"/24", "dev", tap)
	f.vm.MustRun(t, "ip", "link", "set", tap, "up")
	// A static address: the guard must be told, as DHCP would tell it.
	n := &api.Network{ID: netID, Mode: api.ModeShared, DHCP: true}
	if err := f.host.Do(func() error {
		return guard.BindAddress(context.Background(), n, mac, netip.MustParseAddr(vmAddr))
	}); err != nil {
		t.Fatal(err)
	}
}

// helperProc is a running `vmnetctl helper`.
type helperProc struct {
	t     *testing.T
	cmd   *exec.Cmd
	ready helperproto.Ready
	mu    sync.Mutex
	lines []string
	done  chan struct{}
	err   error
}

// startHelper starts the helper in the host namespace and waits for its
// JSON line.
func (f *fixture) startHelper(t *testing.T, extra []*os.File, args ...string) *helperProc {
	t.Helper()
	h, line := f.launch(t, extra, args...)
	if line == "" {
		t.Fatalf("helper printed no ready line; stderr:\n%s", h.stderr())
	}
	r, err := helperproto.ParseReady([]byte(line))
	if err != nil {
		t.Fatalf("helper's ready line %q: %v", line, err)
	}
	h.ready = r
	return h
}

// launch starts the helper and returns its first stdout line, or "" if it
// exited first.
func (f *fixture) launch(t *testing.T, extra []*os.File, args ...string) (*helperProc, string) {
	t.Helper()
	argv := append([]string{"--networks", f.networks, "helper"}, args...)
	if runAsController {
		argv = append([]string{"helper", "--networks", f.networks}, args...)
	}
	cmd := f.host.Command(context.Background(), vmnetctlBin, argv...)
	// As the controller runs helpers: the fixture's network is up, and
	// the helper does not hold it (no state dir, no controller).
	cmd.Env = append(os.Environ(), helperproto.EnvUnderController+"=1")
	cmd.ExtraFiles = extra
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &helperProc{t: t, cmd: cmd, done: make(chan struct{})}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		io.Copy(io.Discard, stdout)
	}()
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			h.mu.Lock()
			h.lines = append(h.lines, sc.Text())
			h.mu.Unlock()
		}
		h.err = cmd.Wait()
		close(h.done)
	}()
	t.Cleanup(func() {
		select {
		case <-h.done:
		default:
			cmd.Process.Kill()
			<-h.done
		}
		if t.Failed() {
			t.Logf("helper stderr:\n%s", h.stderr())
		}
	})
	select {
	case line := <-lines:
		return h, line
	case <-time.After(10 * time.Second):
		t.Fatalf("no ready line within 10s; stderr:\n%s", h.stderr())
	}
	return nil, ""
}

func (h *helperProc) stderr() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return strings.Join(h.lines, "\n")
}

// lastStats is the helper's last stats line.
func (h *helperProc) lastStats() (helperproto.Stats, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := len(h.lines) - 1; i >= 0; i-- {
		if s, ok := helperproto.ParseStatsLine(h.lines[i]); ok {
			return s, true
		}
	}
	return helperproto.Stats{}, false
}

func (h *helperProc) exited() bool {
	select {
	case <-h.done:
		return true
	default:
		return false
	}
}

// terminate sends SIGTERM and waits for a clean exit.
func (h *helperProc) terminate() {
	h.t.Helper()
	h.cmd.Process.Signal(syscall.SIGTERM)
	h.wait(10 * time.Second)
}

func (h *helperProc) wait(timeout time.Duration) {
	h.t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	if !h.exited() {
		select {
		case <-h.done:
		case <-timer.C:
			h.t.Fatalf("helper did not exit within %v", timeout)
		}
	}
	if h.err != nil {
		h.t.Fatalf("helper exited with %v; stderr:\n%s", h.err, h.stderr())
	}
}

func (f *fixture) linkExists(name string) bool {
	return exec.Command("ip", "-n", f.host.Name, "link", "show", name).Run() == nil
}

// procUID is the real uid in /proc/PID/status.
func procUID(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "Uid:"); ok {
			fields := strings.Fields(rest)
			uid, _ := strconv.Atoi(fields[0])
			for _, f := range fields[1:] {
				if f != fields[0] {
					t.Errorf("uids differ: %s", rest)
				}
			}
			return uid
		}
	}
	t.Fatal("no Uid line")
	return -1
}

// nudge sends a frame from the VM's end, from mac: the helper's counters
// move, and an idle helper (whose stats lines come only every
// heartbeat) writes its next line an interval later.
func nudge(t *testing.T, vm *net.UnixConn, mac net.HardwareAddr) {
	t.Helper()
	frame := make([]byte, 60)
	copy(frame, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(frame[6:], mac)
	frame[12], frame[13] = 0x88, 0xb5 // local experimental
	if _, err := vm.Write(frame); err != nil {
		t.Errorf("writing a frame from the VM: %v", err)
	}
}

func socketpair(t *testing.T) (helperEnd *os.File, vmEnd *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Buffers as vmnet-helper's users set them on both ends.
	for _, fd := range fds {
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 65*1024)
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
	}
	helperEnd = os.NewFile(uintptr(fds[0]), "helper-end")
	vmFile := os.NewFile(uintptr(fds[1]), "vm-end")
	c, err := net.FileConn(vmFile)
	vmFile.Close()
	if err != nil {
		t.Fatal(err)
	}
	return helperEnd, c.(*net.UnixConn)
}

// dialSocket connects to the helper's --socket as a client, bound to its own
// path, and sends a short hello as vfkit does.
func dialSocket(t *testing.T, dir, path string) *net.UnixConn {
	t.Helper()
	laddr := &net.UnixAddr{Name: filepath.Join(dir, "vm.sock"), Net: "unixgram"}
	c, err := net.DialUnix("unixgram", laddr, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); os.Remove(laddr.Name) })
	// The VM runs as the helper's user; sending to a socket needs write
	// permission on it.
	if err := os.Chown(laddr.Name, ownerID, ownerID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("VFKT")); err != nil {
		t.Fatal(err)
	}
	return c
}

// redialSocket is dialSocket for a VMM started again on the same path: it
// binds vm.sock, then connects to the helper once the helper follows it (a
// connect to the helper's socket is refused, EPERM, while that socket is
// still connected to the old VMM's address).
func redialSocket(t *testing.T, dir, path string) *net.UnixConn {
	t.Helper()
	local := filepath.Join(dir, "vm.sock")
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: local}); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(local, ownerID, ownerID); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, func() error { return unix.Connect(fd, &unix.SockaddrUnix{Name: path}) }, "the helper to follow the new VMM")
	f := os.NewFile(uintptr(fd), "vm.sock")
	defer f.Close()
	fc, err := net.FileConn(f)
	if err != nil {
		t.Fatal(err)
	}
	c := fc.(*net.UnixConn)
	t.Cleanup(func() { c.Close(); os.Remove(local) })
	if _, err := c.Write([]byte("VFKT")); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestRelay(t *testing.T) {
	tests := []struct {
		name   string
		socket bool
		tso    bool
		csum   bool
	}{
		{name: "fd"},
		{name: "socket", socket: true},
		{name: "fd with TSO", tso: true},
		{name: "socket with checksum offload", socket: true, csum: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			id := "2835E074-9892-4A79-AFFB-7E41D2605678"
			hdr, offloads := 0, 0
			args := []string{"--interface-id", id, "--uid", strconv.Itoa(ownerID), "--gid", strconv.Itoa(ownerID), "--stats-interval", "0.2"}
			switch {
			case tt.tso:
				args = append(args, "--enable-tso")
				hdr, offloads = helper.VirtioNetHdrLen, unix.TUN_F_CSUM|unix.TUN_F_TSO4|unix.TUN_F_TSO6
			case tt.csum:
				args = append(args, "--enable-checksum-offload")
				hdr, offloads = helper.VirtioNetHdrLen, unix.TUN_F_CSUM
			}
			tap := openTap(t, f.vm, "vmeth0", hdr > 0, offloads)

			var h *helperProc
			var conn *net.UnixConn
			if tt.socket {
				path := filepath.Join(f.dir, "helper.sock")
				h = f.startHelper(t, nil, append(args, "--socket", path)...)
				fi, err := os.Stat(path)
				if err != nil {
					t.Fatalf("socket not there after the ready line: %v", err)
				}
				st := fi.Sys().(*syscall.Stat_t)
				if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 || st.Uid != ownerID {
					t.Errorf("socket %s: mode %v uid %d, want a 0600 socket of uid %d", path, fi.Mode(), st.Uid, ownerID)
				}
				if _, err := os.Stat(path + ".lock"); err != nil {
					t.Errorf("lock: %v", err)
				}
				// A second helper on the same path must refuse.
				_, line := f.launch(t, nil, "--socket", path, "--tap", "vmt-second")
				if line != "" {
					t.Errorf("second helper on %s printed %q", path, line)
				}
				conn = dialSocket(t, f.dir, path)
				defer func() {
					testutil.Eventually(t, 5*time.Second, func() bool {
						_, e1 := os.Stat(path)
						_, e2 := os.Stat(path + ".lock")
						return errors.Is(e1, os.ErrNotExist) && errors.Is(e2, os.ErrNotExist)
					}, "socket and lock removal")
				}()
			} else {
				var helperEnd *os.File
				helperEnd, conn = socketpair(t)
				h = f.startHelper(t, []*os.File{helperEnd}, append(args, "--fd", "3")...)
				// The helper sized its own end (the test made it 65 KiB):
				// its sends to the VM have room for several segments.
				want, err := helperproto.SendBufferOnThisHost()
				if err != nil {
					t.Fatal(err)
				}
				if got, err := unix.GetsockoptInt(int(helperEnd.Fd()), unix.SOL_SOCKET, unix.SO_SNDBUF); err != nil || got != want {
					t.Errorf("the helper's end has SO_SNDBUF %d (%v), want %d", got, err, want)
				}
				helperEnd.Close()
			}

			// The JSON line.
			r := h.ready
			wantMax := 1514
			if tt.tso {
				wantMax = 65550
			}
			if r.MACAddress.String() != api.InterfaceMAC(id).String() || r.MTU != 1500 || r.MaxPacketSize != wantMax ||
				r.InterfaceID != id || r.StartAddress.String() != gateway || r.EndAddress.String() != "192.168.105.254" ||
				r.SubnetMask.String() != "255.255.255.0" || r.TapName != api.TapName(id) {
				t.Errorf("ready line = %+v", r)
			}
			if !f.linkExists(r.TapName) {
				t.Fatalf("TAP %s does not exist", r.TapName)
			}
			if uid := procUID(t, h.cmd.Process.Pid); uid != ownerID {
				t.Errorf("helper runs as uid %d, want %d", uid, ownerID)
			}

			relay := startRelay(tap, conn, hdr)
			f.setupVM(t, "vmeth0", r.MACAddress)
			testutil.Eventually(t, 10*time.Second, func() bool { return f.vm.Ping(gateway, 1) == nil }, "ping from the VM to the gateway")

			const size = 20 << 20
			// Every byte, in order (the VM's segments are merged on the
			// way to the host without offloads).
			for _, toVM := range []bool{false, true} {
				gbps := testutil.StreamChecked(t, f.host, f.vm, gateway+":0", size, toVM)
				t.Logf("stream toVM=%v: %.2f Gbit/s", toVM, gbps)
			}

			// A stats line comes every 0.2 s.
			testutil.Eventually(t, 5*time.Second, func() bool {
				s, ok := h.lastStats()
				return ok && s.VM.Bytes >= size && s.Host.Bytes >= size
			}, "a stats line with the stream")

			// At a quiet moment the counters equal what the relay sent, to
			// the byte. (Checked before SIGTERM: late TCP segments can be in
			// the socket when the helper stops, and those it never counts.)
			testutil.Eventually(t, 10*time.Second, func() bool {
				s, ok := h.lastStats()
				return ok && s.VM.Drops == 0 && s.VM.Bytes == relay.sent.Load()
			}, "the helper's count of the VM's bytes to equal the relay's")

			h.terminate()
			if f.linkExists(r.TapName) {
				t.Errorf("TAP %s still exists after SIGTERM", r.TapName)
			}
			s, ok := h.lastStats()
			if !ok {
				t.Fatal("no stats line")
			}
			// Every frame the helper sent reaches the relay (the socket is
			// reliable); the helper never counts more than the relay sent.
			testutil.Eventually(t, 5*time.Second, func() bool {
				return relay.received.Load() == s.Host.Bytes
			}, "the relay to read the helper's last frames")
			relay.stop()
			if s.VM.Bytes > relay.sent.Load() {
				t.Errorf("relay sent %d bytes, helper counted %d from the VM", relay.sent.Load(), s.VM.Bytes)
			}
			if s.VM.Bytes < size || s.Host.Bytes < size {
				t.Errorf("stats %+v: want at least %d bytes each way", s, size)
			}
			if s.Host.Fast+s.Host.Slow == 0 || s.VM.Fast+s.VM.Slow == 0 {
				t.Errorf("stats %+v: no syscalls counted", s)
			}
			t.Logf("final stats: host %+v vm %+v", s.Host, s.VM)
		})
	}
}

func TestPeerGone(t *testing.T) {
	for _, socket := range []bool{false, true} {
		t.Run(map[bool]string{false: "fd", true: "socket"}[socket], func(t *testing.T) {
			f := newFixture(t)
			tap := openTap(t, f.vm, "vmeth0", false, 0)
			var h *helperProc
			var conn *net.UnixConn
			if socket {
				path := filepath.Join(f.dir, "helper.sock")
				h = f.startHelper(t, nil, "--socket", path, "--uid", strconv.Itoa(ownerID))
				conn = dialSocket(t, f.dir, path)
			} else {
				var helperEnd *os.File
				helperEnd, conn = socketpair(t)
				h = f.startHelper(t, []*os.File{helperEnd}, "--fd", "3", "--uid", strconv.Itoa(ownerID))
				helperEnd.Close()
			}
			relay := startRelay(tap, conn, 0)
			f.setupVM(t, "vmeth0", h.ready.MACAddress)
			testutil.Eventually(t, 10*time.Second, func() bool { return f.vm.Ping(gateway, 1) == nil }, "ping from the VM to the gateway")

			relay.stop()
			if socket {
				// --socket: the VMM exits and starts again on the same
				// path (a new socket there). The helper keeps the VM's
				// port through it and serves the new one.
				os.Remove(filepath.Join(f.dir, "vm.sock"))
				f.host.Ping(vmAddr, 1) // traffic towards the gone VM
				tap = openTap(t, f.vm, "vmeth0", false, 0)
				conn = dialSocket(t, f.dir, filepath.Join(f.dir, "helper.sock"))
				relay = startRelay(tap, conn, 0)
				defer relay.stop()
				f.setupVM(t, "vmeth0", h.ready.MACAddress)
				testutil.Eventually(t, 10*time.Second, func() bool { return f.vm.Ping(gateway, 1) == nil }, "ping from the restarted VM")
				if h.exited() {
					t.Errorf("the helper exited with its VMM")
				}
				return
			}
			// --fd: the VM dies. The helper notices when it next sends to
			// it (a dgram socket has no hangup, so traffic towards the VM
			// tells) and ends with it.
			testutil.Eventually(t, 10*time.Second, func() bool {
				f.host.Ping(vmAddr, 1)
				return h.exited()
			}, "the helper to exit")
			h.wait(0)
			if f.linkExists(h.ready.TapName) {
				t.Errorf("TAP %s still exists after the peer went away", h.ready.TapName)
			}
		})
	}
}

// TestNewMACAfterRestart: a VMM started again on the same --socket path
// may pick a MAC of its own (vmnet-helper's "any MAC address works"), here
// neither the first VMM's nor the one the helper derived; with no MAC
// pinned, the helper's port forgets the MAC it learned and learns the new
// one.
func TestNewMACAfterRestart(t *testing.T) {
	f := newFixture(t)
	tap := openTap(t, f.vm, "vmeth0", false, 0)
	path := filepath.Join(f.dir, "helper.sock")
	// As root (no --uid), as the controller runs it: it may guard again.
	h := f.startHelper(t, nil, "--socket", path)
	conn := dialSocket(t, f.dir, path)
	relay := startRelay(tap, conn, 0)
	first, _ := net.ParseMAC("02:00:00:aa:00:01")
	if first.String() == h.ready.MACAddress.String() {
		t.Fatal("the test's MAC is the derived one")
	}
	f.setupVM(t, "vmeth0", first)
	testutil.Eventually(t, 10*time.Second, func() bool { return f.vm.Ping(gateway, 1) == nil }, "ping from the VM")
	relay.stop()

	os.Remove(filepath.Join(f.dir, "vm.sock"))
	tap = openTap(t, f.vm, "vmeth0", false, 0)
	conn = redialSocket(t, f.dir, path)
	relay = startRelay(tap, conn, 0)
	defer relay.stop()
	second, _ := net.ParseMAC("02:00:00:aa:00:02")
	f.setupVM(t, "vmeth0", second)
	testutil.Eventually(t, 10*time.Second, func() bool { return f.vm.Ping(gateway, 1) == nil }, "ping from the restarted VM with a new MAC")
	// Its stderr is read through a pipe: the line may come a moment later.
	testutil.Eventually(t, 5*time.Second, func() bool { return strings.Contains(h.stderr(), "learns the new VMM's MAC") },
		"the helper to say it guarded the port again")
}

// TestJumbo relays 9000-byte frames on a network with MTU 9000.
func TestJumbo(t *testing.T) {
	f := newFixture(t)
	os.WriteFile(f.networks, []byte(networks+"    mtu: 9000\n"), 0o644)
	f.host.MustRun(t, "ip", "link", "set", f.bridge, "mtu", "9000")
	tap := openTap(t, f.vm, "vmeth0", false, 0)
	helperEnd, conn := socketpair(t)
	// Stats asked for: the last line at exit has the counters.
	h := f.startHelper(t, []*os.File{helperEnd}, "--fd", "3", "--stats-interval", "60")
	helperEnd.Close()
	if h.ready.MTU != 9000 || h.ready.MaxPacketSize != 9014 {
		t.Errorf("ready line: mtu %d, max packet size %d; want 9000, 9014", h.ready.MTU, h.ready.MaxPacketSize)
	}
	relay := startRelay(tap, conn, 0)
	defer relay.stop()
	f.vm.MustRun(t, "ip", "link", "set", "vmeth0", "mtu", "9000")
	f.setupVM(t, "vmeth0", h.ready.MACAddress)
	// 8972 bytes of ICMP payload: a 9014-byte frame each way, unfragmented.
	testutil.Eventually(t, 10*time.Second, func() error {
		_, err := f.vm.Run(context.Background(), "ping", "-n", "-q", "-c", "1", "-W", "1", "-s", "8972", "-M", "do", gateway)
		return err
	}, "a jumbo ping")
	h.terminate()
	if s, _ := h.lastStats(); s.Host.Bytes < 9014 || s.VM.Bytes < 9014 || s.VM.Drops != 0 {
		t.Errorf("stats %+v: want a 9014-byte frame each way", s)
	}
}

func TestStableMAC(t *testing.T) {
	f := newFixture(t)
	id := "6f1c2d4e-0000-4000-8000-0123456789ab"
	var macs []string
	for range 2 {
		helperEnd, _ := socketpair(t)
		h := f.startHelper(t, []*os.File{helperEnd}, "--fd", "3", "--interface-id", id)
		helperEnd.Close()
		macs = append(macs, h.ready.MACAddress.String())
		h.terminate()
	}
	if macs[0] != macs[1] || macs[0] != api.InterfaceMAC(id).String() {
		t.Errorf("MACs for one interface id: %v, want %s", macs, api.InterfaceMAC(id))
	}
	// Without an id, a random one is reported and the MAC derives from it.
	helperEnd, _ := socketpair(t)
	h := f.startHelper(t, []*os.File{helperEnd}, "--fd", "3")
	helperEnd.Close()
	if err := api.CheckInterfaceID(h.ready.InterfaceID); err != nil || h.ready.MACAddress.String() != api.InterfaceMAC(h.ready.InterfaceID).String() {
		t.Errorf("random id: %+v (%v)", h.ready, err)
	}
	h.terminate()
}

func TestAttachTap(t *testing.T) {
	f := newFixture(t)
	h := f.startHelper(t, nil, "--attach", "tap", "--uid", strconv.Itoa(ownerID), "--gid", strconv.Itoa(ownerID), "--stats-interval", "0.1", "--tap", "vmt-attach")
	if h.ready.TapName != "vmt-attach" {
		t.Fatalf("tap_name = %q", h.ready.TapName)
	}
	if index := strings.TrimSpace(f.host.MustRun(t, "cat", "/sys/class/net/vmt-attach/ifindex")); strconv.Itoa(h.ready.TapIndex) != index {
		t.Errorf("tap_index = %d, the TAP's ifindex %s", h.ready.TapIndex, index)
	}
	owner := strings.TrimSpace(f.host.MustRun(t, "cat", "/sys/class/net/vmt-attach/tun_flags", "/sys/class/net/vmt-attach/owner", "/sys/class/net/vmt-attach/brport/bridge/uevent"))
	if !strings.Contains(owner, "\n65534\n") || !strings.Contains(owner, "INTERFACE="+f.bridge) {
		t.Errorf("TAP flags, owner, bridge: %q", owner)
	}
	// The VMM opens the TAP, as firecracker would, and moves its frames to
	// and from the VM (here: a TAP in the VM's namespace).
	vmm := openTap(t, f.host, "vmt-attach", false, 0)
	vmTap := openTap(t, f.vm, "vmeth0", false, 0)
	vmmRelay := startRelay(vmTap, vmm, 0)
	defer vmmRelay.stop()
	f.setupVM(t, "vmeth0", h.ready.MACAddress)
	testutil.Eventually(t, 10*time.Second, func() bool { return f.vm.Ping(gateway, 1) == nil }, "ping from the VM to the gateway")
	// On a TAP the kernel's rx is what the VM sent: "vm" in the stats.
	testutil.Eventually(t, 5*time.Second, func() bool {
		s, ok := h.lastStats()
		return ok && s.VM.Packets >= 2 && s.Host.Packets >= 2 && s.VM.Bytes >= 98+42
	}, "stats with the ping")
	if uid := procUID(t, h.cmd.Process.Pid); uid != ownerID {
		t.Errorf("helper runs as uid %d, want %d", uid, ownerID)
	}
	// It holds the TAP as vmnetctl-relay (relay.Hold), in less memory.
	if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", h.cmd.Process.Pid)); filepath.Base(exe) != relay.Binary {
		t.Errorf("the TAP's helper runs %s, want %s", exe, relay.Binary)
	}
	// SIGTERM deletes the TAP even while the VMM still has it open.
	h.terminate()
	testutil.Eventually(t, 5*time.Second, func() bool { return !f.linkExists("vmt-attach") }, "TAP vmt-attach to be deleted after SIGTERM")

	// So does kill -9.
	h = f.startHelper(t, nil, "--attach", "tap", "--uid", strconv.Itoa(ownerID), "--tap", "vmt-attach")
	h.cmd.Process.Kill()
	<-h.done
	testutil.Eventually(t, 5*time.Second, func() bool { return !f.linkExists("vmt-attach") }, "TAP vmt-attach to be deleted after kill -9")
}

func TestFailures(t *testing.T) {
	f := newFixture(t)
	other := filepath.Join(f.dir, "other.yaml")
	os.WriteFile(other, []byte(strings.ReplaceAll(networks, "shared", "host")), 0o644)
	tests := []struct {
		name string
		args []string
		want string
	}{
		// A network that is not up is brought up (HoldNetwork), here in
		// a state dir of the test's own: host's subnet is the bridge's
		// that the fixture made, so that fails, and says why.
		{"network down", []string{"--state-dir", filepath.Join(t.TempDir(), "state"), "--networks", other, "helper", "--attach", "tap", "--network", "host"},
			`network "host" is not up, and bringing it up failed`},
		{"unknown network", []string{"helper", "--fd", "0", "--network", "nope"}, `network "nope" is not defined`},
		{"fd and socket", []string{"helper", "--fd", "0", "--socket", "/tmp/x"}, "exactly one of --fd and --socket"},
		{"not a socket", []string{"helper", "--fd", "0"}, "is not a unix datagram socket"},
		// Addresses that overlap a network of networks.yaml without
		// matching it (other addresses are a network made on demand).
		{"addresses mismatch", []string{"helper", "--fd", "0", "--start-address", "192.168.105.1", "--end-address", "192.168.105.9", "--subnet-mask", "255.255.255.0"}, "do not match network"},
		{"partial addresses", []string{"helper", "--fd", "0", "--start-address", "192.168.105.1"}, "must be given together"},
		{"bad interface id", []string{"helper", "--fd", "0", "--interface-id", "nope"}, "is not a UUID"},
		{"tso with attach", []string{"helper", "--attach", "tap", "--enable-tso"}, "have no meaning with --attach tap"},
		{"vhost-user without a socket", []string{"helper", "--attach", "vhost-user", "--fd", "0"}, "--attach vhost-user serves --socket PATH"},
		{"vhost-user with tso", []string{"helper", "--attach", "vhost-user", "--socket", "/tmp/x", "--enable-tso"}, "have no meaning with --attach vhost-user"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := tt.args
			if tt.args[0] == "helper" {
				args = append([]string{"--networks", f.networks}, tt.args...)
			}
			var stdout, stderr bytes.Buffer
			cmd := f.host.Command(context.Background(), vmnetctlBin, args...)
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if tt.name != "network down" {
				// Not the host's state dir: these helpers hold nothing.
				cmd.Env = append(os.Environ(), helperproto.EnvUnderController+"=1")
			}
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Errorf("exit: %v, want status 1", err)
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout = %q, want nothing", stdout.String())
			}
			if !strings.Contains(stderr.String(), tt.want) {
				t.Errorf("stderr = %q, want %q", stderr.String(), tt.want)
			}
		})
	}
}

func TestVersion(t *testing.T) {
	out := testutil.Run(t, vmnetctlBin, "helper", "--version")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "version: v") || !strings.HasPrefix(lines[1], "commit: ") {
		t.Errorf("--version printed %q", out)
	}
}

// TestDHCP joins a network the data plane runs (netplane.Start: bridge,
// nftables, DHCP server, DNS proxy) and gets a lease in the VM.
func TestDHCP(t *testing.T) {
	f := newFixture(t)
	// The data plane creates the bridge itself.
	f.host.MustRun(t, "ip", "link", "del", f.bridge)
	testutil.RequireCommands(t, "nft", "busybox")
	nets, _, err := config.LoadNetworks(f.networks)
	if err != nil {
		t.Fatal(err)
	}
	n := nets.Get(netID)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resolv := filepath.Join(f.dir, "resolv.conf")
	os.WriteFile(resolv, []byte("nameserver 192.0.2.53\n"), 0o644)
	var nw *netplane.Network
	if err := f.host.Do(func() (err error) {
		nw, err = netplane.Start(ctx, n, netplane.Options{ResolvConf: resolv, Upstreams: []string{"192.0.2.53:53"}})
		return err
	}); err != nil {
		t.Fatalf("starting the network: %v", err)
	}
	defer nw.Close()

	tap := openTap(t, f.vm, "vmeth0", false, 0)
	helperEnd, conn := socketpair(t)
	h := f.startHelper(t, []*os.File{helperEnd}, "--fd", "3", "--network", netID, "--uid", strconv.Itoa(ownerID))
	helperEnd.Close()
	if h.ready.IPv4Subnet.String() != "192.168.105.0" || h.ready.IPv4Mask.String() != "255.255.255.0" {
		t.Errorf("--network ready line: %+v", h.ready)
	}
	relay := startRelay(tap, conn, 0)
	defer relay.stop()
	f.vm.MustRun(t, "ip", "link", "set", "vmeth0", "address", h.ready.MACAddress.String())
	f.vm.MustRun(t, "ip", "link", "set", "vmeth0", "up")

	// The lease is applied to vmeth0 (address, route) as it comes.
	lease, err := f.vm.DHCP(t, "vmeth0")
	if err != nil {
		t.Fatal(err)
	}
	if lease["mask"] != "24" || lease["router"] != gateway {
		t.Fatalf("lease %v, want an address in 192.168.105.0/24 with router %s", lease, gateway)
	}
	if err := testutil.InRange(lease["ip"], n.DHCPStart.String(), n.DHCPEnd.String()); err != nil {
		t.Fatalf("leased %v", err)
	}
	t.Logf("leased %s", lease["ip"])
	testutil.Eventually(t, 10*time.Second, func() bool { return f.vm.Ping(gateway, 1) == nil }, "ping from the leased address to the gateway")
	h.terminate()
}

// TestBridged joins a bridged network whose interface is a bridge (the
// host's LAN bridge), chosen the vmnet-helper way.
func TestBridged(t *testing.T) {
	f := newFixture(t)
	f.host.MustRun(t, "ip", "link", "add", "br-lan", "type", "bridge")
	f.host.MustRun(t, "ip", "addr", "add", "10.9.0.1/24", "dev", "br-lan")
	f.host.MustRun(t, "ip", "link", "set", "br-lan", "up")
	cfg := filepath.Join(f.dir, "bridged.yaml")
	os.WriteFile(cfg, []byte("networks:\n  lan:\n    mode: bridged\n    interface: br-lan\n"), 0o644)

	tap := openTap(t, f.vm, "vmeth0", false, 0)
	helperEnd, conn := socketpair(t)
	f.networks = cfg
	h := f.startHelper(t, []*os.File{helperEnd}, "--fd", "3", "--operation-mode", "bridged", "--shared-interface", "br-lan")
	helperEnd.Close()
	if h.ready.StartAddress.IsValid() || h.ready.MaxPacketSize != 1514 {
		t.Errorf("bridged ready line: %+v", h.ready)
	}
	relay := startRelay(tap, conn, 0)
	defer relay.stop()
	f.vm.MustRun(t, "ip", "link", "set", "vmeth0", "address", h.ready.MACAddress.String())
	f.vm.MustRun(t, "ip", "addr", "add", "10.9.0.7/24", "dev", "vmeth0")
	f.vm.MustRun(t, "ip", "link", "set", "vmeth0", "up")
	testutil.Eventually(t, 10*time.Second, func() bool { return f.vm.Ping("10.9.0.1", 1) == nil }, "ping from the VM to the LAN")
	h.terminate()
}

// TestMacvtap joins a bridged network on an interface that is not a bridge:
// the VM's port is a macvtap on it. The "LAN" is a namespace at the other
// end of a veth.
func TestMacvtap(t *testing.T) {
	f := newFixture(t)
	lan := testutil.NewNS(t, "vmnh-lan")
	f.host.MustRun(t, "ip", "link", "add", "lan0", "type", "veth", "peer", "name", "eth0", "netns", lan.Name)
	f.host.MustRun(t, "ip", "link", "set", "lan0", "up")
	lan.MustRun(t, "ip", "addr", "add", "10.9.1.1/24", "dev", "eth0")
	lan.MustRun(t, "ip", "link", "set", "eth0", "up")
	f.networks = filepath.Join(f.dir, "lan.yaml")
	os.WriteFile(f.networks, []byte("networks:\n  lan:\n    mode: bridged\n    interface: lan0\n"), 0o644)

	for _, kill := range []bool{false, true} {
		tap := openTap(t, f.vm, "vmeth0", false, 0)
		helperEnd, conn := socketpair(t)
		h := f.startHelper(t, []*os.File{helperEnd}, "--fd", "3", "--network", "lan", "--uid", strconv.Itoa(ownerID), "--tap", "vmt-mv")
		helperEnd.Close()
		if uid := procUID(t, h.cmd.Process.Pid); uid != ownerID {
			t.Errorf("helper runs as uid %d", uid)
		}
		// As the VM's owner, in vmnetctl-relay too: the macvtap's cleanup
		// pipe went along (the checks below: deleted when it ends).
		if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", h.cmd.Process.Pid)); filepath.Base(exe) != relay.Binary {
			t.Errorf("the macvtap's helper runs %s, want %s", exe, relay.Binary)
		}
		relay := startRelay(tap, conn, 0)
		// A macvtap passes the frames of its own MAC: the VM must use it.
		f.setupVM(t, "vmeth0", h.ready.MACAddress)
		f.vm.MustRun(t, "ip", "addr", "add", "10.9.1.7/24", "dev", "vmeth0")
		testutil.Eventually(t, 10*time.Second, func() bool { return f.vm.Ping("10.9.1.1", 1) == nil }, "ping from the VM to the LAN")
		if kill {
			// Even a helper killed outright leaves no macvtap behind.
			h.cmd.Process.Kill()
			<-h.done
		} else {
			// Stopped, the helper ends only once its macvtap is gone: a
			// helper started again at once would take it over. (Its
			// process's end, not its pipes', which the cleanup child holds
			// too.)
			pid := h.cmd.Process.Pid
			h.cmd.Process.Signal(syscall.SIGTERM)
			testutil.Eventually(t, 10*time.Second, func() bool {
				st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
				return err != nil || strings.Contains(string(st), ") Z ")
			}, "the helper to exit")
			if f.linkExists("vmt-mv") {
				t.Errorf("macvtap vmt-mv is still there once its helper has exited")
			}
			h.wait(10 * time.Second)
		}
		testutil.Eventually(t, 5*time.Second, func() bool { return !f.linkExists("vmt-mv") }, "the macvtap to be deleted")
		relay.stop() // closing the VM's TAP deletes it too
	}
}

// TestNoStatsUnlessAsked: without --stats-interval the helper logs no stats
// line, not even at exit (vmnet-helper's contract).
func TestNoStatsUnlessAsked(t *testing.T) {
	f := newFixture(t)
	helperEnd, _ := socketpair(t)
	h := f.startHelper(t, []*os.File{helperEnd}, "--fd", "3")
	helperEnd.Close()
	h.terminate()
	h.wait(10 * time.Second)
	if strings.Contains(h.stderr(), "[stats]") {
		t.Errorf("stats lines without --stats-interval:\n%s", h.stderr())
	}
}

// TestLogTimestamps: with --log-timestamps (what the controller asks for)
// every line of the helper's log starts with its time, its stats lines
// included, which still parse as stats; without it the lines are
// vmnet-helper's, which start with their level.
func TestLogTimestamps(t *testing.T) {
	f := newFixture(t)
	for _, stamped := range []bool{true, false} {
		helperEnd, vm := socketpair(t)
		args := []string{"--fd", "3", "--stats-interval", "0.1"}
		if stamped {
			args = append(args, "--log-timestamps")
		}
		began := time.Now().Add(-time.Second)
		h := f.startHelper(t, []*os.File{helperEnd}, args...)
		helperEnd.Close()
		testutil.Eventually(t, 10*time.Second, func() bool {
			nudge(t, vm, h.ready.MACAddress)
			return strings.Contains(h.stderr(), "[stats]")
		}, "a stats line")
		h.terminate()
		h.wait(10 * time.Second)
		stats := 0
		for _, line := range strings.Split(strings.TrimSpace(h.stderr()), "\n") {
			at, rest, ok := helperproto.CutLogTime(line)
			switch {
			case ok != stamped:
				t.Errorf("--log-timestamps %v: line %q", stamped, line)
			case ok && (at.Before(began) || at.After(time.Now())):
				t.Errorf("line %q: its time %v is not now", line, at)
			case !strings.HasPrefix(rest, "INFO") && !strings.HasPrefix(rest, "WARN") && !strings.HasPrefix(rest, "DEBUG"):
				t.Errorf("line %q: no level after its time", line)
			}
			if _, ok := helperproto.ParseStatsLine(line); ok {
				stats++
			}
		}
		if stats == 0 {
			t.Errorf("--log-timestamps %v: no stats line parsed in:\n%s", stamped, h.stderr())
		}
	}
}

// TestStatsFile: with --stats-file (what the controller asks for) the
// file holds the helper's latest stats line, written every interval, and
// the log gets only the first and the last of them (at most one a minute
// between); the relay it execs into keeps writing the file.
func TestStatsFile(t *testing.T) {
	f := newFixture(t)
	helperEnd, vm := socketpair(t)
	statsFile := filepath.Join(t.TempDir(), "a.stats")
	h := f.startHelper(t, []*os.File{helperEnd}, "--fd", "3", "--stats-interval", "0.1", "--stats-file", statsFile)
	helperEnd.Close()
	seen := map[time.Time]bool{}
	testutil.Eventually(t, 20*time.Second, func() error {
		nudge(t, vm, h.ready.MACAddress)
		if s, ok := helperproto.ReadStatsFile(statsFile); ok {
			seen[s.Time] = true
		}
		if len(seen) < 3 {
			return fmt.Errorf("the stats file had %d lines so far", len(seen))
		}
		return nil
	}, "the stats file to be written three times")
	h.terminate()
	h.wait(10 * time.Second)
	if n := strings.Count(h.stderr(), "[stats]"); n != 2 {
		t.Errorf("%d stats lines logged with --stats-file, want the first and the last:\n%s", n, h.stderr())
	}
}
