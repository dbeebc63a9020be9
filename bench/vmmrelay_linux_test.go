package bench

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/guard"
	"github.com/vmnetctl/vmnetctl/test/testutil"
	"github.com/vmnetctl/vmnetctl/vhostuser"
)

// vmmRelayEnv makes the test binary the minimal VMM relay instead of the
// tests: the benchmark starts it in the VM's namespace.
const vmmRelayEnv = "VMNETCTL_BENCH_VMM_RELAY"

// vhostFrontendEnv makes the test binary a vhost-user VMM stand-in
// (vhostuser.Frontend) on the socket it names, its NIC the TAP eth0.
const vhostFrontendEnv = "VMNETCTL_BENCH_VHOST_FRONTEND"

func TestMain(m *testing.M) {
	if v := os.Getenv(vhostFrontendEnv); v != "" {
		sock, mode, _ := strings.Cut(v, ",")
		if err := vhostFrontend(sock, "eth0", mode); err != nil {
			fmt.Fprintln(os.Stderr, "vhost-user frontend:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if tap := os.Getenv(vmmRelayEnv); tap != "" {
		if err := vmmRelay(tap, 3); err != nil {
			fmt.Fprintln(os.Stderr, "vmm relay:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// vmmRelay plays the VMM of one VM as simply as qemu's -netdev dgram does:
// the VM's NIC is the TAP name (created here, in the namespace it runs in),
// and each frame is moved by one blocking read and one blocking write,
// both ways, between the TAP and the helper's socket sock. It prints
// "ready" once the TAP exists and runs until either fd fails.
func vmmRelay(name string, sock int) error {
	tap, err := testutil.OpenTAP(name)
	if err != nil {
		return err
	}
	fmt.Println("ready")
	errc := make(chan error, 2)
	move := func(from, to int) {
		runtime.LockOSThread()
		buf := make([]byte, 65536)
		for {
			n, err := unix.Read(from, buf)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				errc <- err
				return
			}
			if n > 0 {
				unix.Write(to, buf[:n]) // a frame the peer refuses is lost, as in qemu
			}
		}
	}
	go move(tap, sock)
	go move(sock, tap)
	return <-errc
}

// The guest a vhost-user frontend stands in for (vhostFrontend's mode).
const (
	// guestGRO: no offloads, and the guest's GRO merges the runs of TCP
	// segments it takes from its ring before its stack sees them, as a
	// Linux guest's virtio-net driver does by default.
	guestGRO = "gro"
	// guestPlain: no offloads and no GRO: every frame goes through the
	// guest's stack alone.
	guestPlain = "plain"
	// guestOffloads: checksum offload and TSO both ways.
	guestOffloads = "offloads"
)

// vhostFrontend plays a VMM whose NIC uses vhost-user, as qemu's
// vhost-user-net and a guest driver do between them (vhostuser.Frontend):
// the NIC is the TAP name (created here), the backend the helper at sock;
// mode is the guest's (guestGRO, guestPlain, guestOffloads). It prints
// "ready" once connected and runs until Relay fails.
func vhostFrontend(sock, name, mode string) error {
	open := map[string]func(string) (int, error){
		guestGRO:      testutil.OpenVnetTAP,
		guestPlain:    testutil.OpenTAP,
		guestOffloads: testutil.OpenOffloadTAP,
	}[mode]
	if open == nil {
		return fmt.Errorf("no guest %q", mode)
	}
	tap, err := open(name)
	if err != nil {
		return err
	}
	offloads := mode == guestOffloads
	fe, err := vhostuser.Dial(sock, offloads)
	if err != nil {
		return err
	}
	if fe.Offloads() != offloads {
		return fmt.Errorf("offloads %v, the backend's %v", offloads, fe.Offloads())
	}
	fe.GRO = mode == guestGRO
	fmt.Println("ready")
	return fe.Relay(tap)
}

// startVMMRelay starts vmmRelay in namespace ns on socket fd, and gives its
// TAP (the VM's NIC, eth0) mac and addr/24.
func startVMMRelay(t *testing.T, fd int, ns string, mac net.HardwareAddr, addr string) relay {
	t.Helper()
	f := os.NewFile(uintptr(fd), "sock")
	defer f.Close()
	return startVMM(t, ns, mac, addr, vmmRelayEnv+"=eth0", f)
}

// startVhostFrontend starts vhostFrontend in namespace ns on the helper's
// vhost-user socket sock, and gives its TAP (eth0) mac and addr/24.
func startVhostFrontend(t *testing.T, sock, ns string, mac net.HardwareAddr, addr, mode string) relay {
	t.Helper()
	r := startVMM(t, ns, mac, addr, vhostFrontendEnv+"="+sock+","+mode)
	r.name = "vhost-user frontend"
	return r
}

// startVMM starts this binary as a VMM stand-in (env chooses which) in
// namespace ns, with files as its fds 3, ..., and gives its eth0 mac and
// addr/24 once it says ready.
func startVMM(t *testing.T, ns string, mac net.HardwareAddr, addr, env string, files ...*os.File) relay {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", ns, os.Args[0])
	cmd.Env = append(os.Environ(), env)
	cmd.ExtraFiles = files
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	start(t, cmd)
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		sc.Scan()
		line <- sc.Text()
	}()
	select {
	case l := <-line:
		if l != "ready" {
			t.Fatalf("vmm relay in %s: %q, want ready", ns, l)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("vmm relay in %s: not ready after 10s", ns)
	}
	testutil.Run(t, "ip", "-n", ns, "link", "set", "eth0", "address", mac.String())
	testutil.Run(t, "ip", "-n", ns, "addr", "add", addr+"/24", "dev", "eth0")
	testutil.Run(t, "ip", "-n", ns, "link", "set", "eth0", "up")
	return relay{name: "vmm relay", pid: cmd.Process.Pid}
}

// bindAddress binds addr to mac in the guard of network "shared" in hns:
// the "VMs" of the benchmark have static addresses, which their guarded
// ports must be told of, as DHCP would tell them.
func bindAddress(t *testing.T, hns *testutil.NS, mac net.HardwareAddr, addr string) {
	t.Helper()
	n := &api.Network{ID: "shared", Mode: api.ModeShared, DHCP: true}
	if err := hns.Do(func() error {
		return guard.BindAddress(t.Context(), n, mac, netip.MustParseAddr(addr))
	}); err != nil {
		t.Fatal(err)
	}
}
