// Package simvm gives end-to-end tests simulated VMs: a network namespace
// whose eth0 is a TAP, with the frames of that TAP relayed to and from a
// vmnetctl helper's unix datagram socket, as qemu's `-netdev dgram` does;
// and real tools (busybox udhcpc, ping) running inside the namespace.
package simvm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NeedRoot skips the test unless it runs as root with the tools it needs.
func NeedRoot(t testing.TB, tools ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	for _, tool := range append([]string{"ip"}, tools...) {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (test/setup.sh installs it)", tool)
		}
	}
}

var nsSeq atomic.Int64

// NS is a network namespace made by a test, removed with everything that
// runs in it when the test ends, whether it passed or not.
type NS struct {
	Name string
}

// NewNS creates a namespace with loopback up.
func NewNS(t testing.TB, prefix string) *NS {
	t.Helper()
	name := fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), nsSeq.Add(1))
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	n := &NS{Name: name}
	t.Cleanup(func() { n.Delete() })
	if _, err := n.Run(context.Background(), "ip", "link", "set", "lo", "up"); err != nil {
		t.Fatal(err)
	}
	return n
}

// Delete kills every process in the namespace and removes it.
func (n *NS) Delete() {
	if out, err := exec.Command("ip", "netns", "pids", n.Name).Output(); err == nil {
		for _, pid := range strings.Fields(string(out)) {
			exec.Command("kill", "-9", pid).Run()
		}
	}
	exec.Command("ip", "netns", "delete", n.Name).Run()
}

// Command returns a command that runs inside the namespace.
func (n *NS) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
}

// Run runs a command inside the namespace and returns its combined output.
func (n *NS) Run(ctx context.Context, name string, args ...string) (string, error) {
	out, err := n.Command(ctx, name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s in %s: %w: %s", name, strings.Join(args, " "), n.Name, err, out)
	}
	return string(out), nil
}

// Do runs f on an OS thread that is inside the namespace.
func (n *NS) Do(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// The thread is left locked (and so discarded) if switching back fails.
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		target, err := netns.GetFromName(n.Name)
		if err != nil {
			errc <- err
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			errc <- err
			return
		}
		ferr := f()
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(ferr, err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// VM is a simulated VM: a namespace whose eth0 is a TAP relayed to a helper.
type VM struct {
	*NS
	MAC string

	tap    *os.File
	conn   *net.UnixConn
	remote *net.UnixAddr
	wg     sync.WaitGroup
	closed atomic.Bool
}

// maxFrame is the largest frame the relay moves (jumbo MTUs included).
const maxFrame = 65536

// AttachSocket makes a simulated VM whose eth0 (with mac) is relayed to the
// helper socket at helperPath, from a client socket bound at clientPath:
// what qemu does with -netdev dgram,local.type=unix,...,remote.type=unix.
// Every datagram is sent to helperPath by name, so a restarted helper is
// reached again at the same path.
func AttachSocket(t testing.TB, name, mac, helperPath, clientPath string) *VM {
	t.Helper()
	vm := &VM{NS: NewNS(t, name), MAC: mac}
	vm.openTap(t)
	os.Remove(clientPath)
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: clientPath, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	vm.conn, vm.remote = conn, &net.UnixAddr{Name: helperPath, Net: "unixgram"}
	vm.start()
	t.Cleanup(vm.Close)
	return vm
}

type ifreq struct {
	name  [unix.IFNAMSIZ]byte
	flags uint16
	_     [22]byte
}

func (vm *VM) openTap(t testing.TB) {
	t.Helper()
	err := vm.Do(func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		var req ifreq
		copy(req.name[:], "eth0")
		req.flags = unix.IFF_TAP | unix.IFF_NO_PI
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(&req))); errno != 0 {
			unix.Close(fd)
			return fmt.Errorf("TUNSETIFF: %w", errno)
		}
		// Non-blocking, so that the runtime poller owns it and Close
		// interrupts a pending Read.
		if err := unix.SetNonblock(fd, true); err != nil {
			unix.Close(fd)
			return err
		}
		vm.tap = os.NewFile(uintptr(fd), "/dev/net/tun")
		return nil
	})
	if err != nil {
		t.Fatalf("creating the TAP of %s: %v", vm.Name, err)
	}
	for _, args := range [][]string{{"link", "set", "eth0", "address", vm.MAC}, {"link", "set", "eth0", "up"}} {
		if _, err := vm.Run(context.Background(), "ip", args...); err != nil {
			t.Fatal(err)
		}
	}
}

func (vm *VM) start() {
	vm.wg.Add(2)
	go func() { // TAP → helper
		defer vm.wg.Done()
		buf := make([]byte, maxFrame)
		for {
			n, err := vm.tap.Read(buf)
			if err != nil {
				return
			}
			vm.conn.WriteToUnix(buf[:n], vm.remote) // a helper between restarts drops it, as a cable would
		}
	}()
	go func() { // helper → TAP
		defer vm.wg.Done()
		buf := make([]byte, maxFrame)
		for {
			n, err := vm.conn.Read(buf)
			if err != nil {
				if vm.closed.Load() || errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			vm.tap.Write(buf[:n])
		}
	}()
}

// Close stops the relay and closes the TAP and socket.
func (vm *VM) Close() {
	if vm.closed.Swap(true) {
		return
	}
	vm.conn.Close()
	vm.tap.Close()
	vm.wg.Wait()
}

const udhcpcScript = `#!/bin/sh
case "$1" in
bound|renew)
	ip addr flush dev "$interface"
	ip addr add "$ip/$mask" dev "$interface"
	[ -n "$mtu" ] && ip link set dev "$interface" mtu "$mtu"
	for r in $router; do ip route add default via "$r" dev "$interface"; break; done
	{ echo "ip=$ip"; echo "mask=$mask"; echo "router=$router"; echo "dns=$dns"; echo "mtu=$mtu"; echo "lease=$lease"; } > "$0.out"
	;;
esac
exit 0
`

// DHCP runs busybox udhcpc on eth0 and returns what the lease said: ip,
// mask, router, dns, mtu and lease.
func (vm *VM) DHCP(t testing.TB) map[string]string {
	t.Helper()
	script := filepath.Join(t.TempDir(), "udhcpc.sh")
	if err := os.WriteFile(script, []byte(udhcpcScript), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := vm.Run(ctx, "busybox", "udhcpc", "-i", "eth0", "-s", script, "-q", "-f", "-n", "-t", "10", "-T", "1", "-A", "1", "-O", "mtu"); err != nil {
		t.Fatalf("DHCP in %s: %v", vm.Name, err)
	}
	f, err := os.Open(script + ".out")
	if err != nil {
		t.Fatalf("udhcpc in %s wrote no lease: %v", vm.Name, err)
	}
	defer f.Close()
	lease := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), "=")
		lease[k] = v
	}
	return lease
}

// Ping sends count pings to addr and returns an error unless all are answered.
func (n *NS) Ping(addr string, count int) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(count+10)*time.Second)
	defer cancel()
	_, err := n.Run(ctx, "ping", "-n", "-q", "-c", fmt.Sprint(count), "-W", "2", addr)
	return err
}

// Eventually polls f until it returns nil or the deadline passes.
func Eventually(t testing.TB, d time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true after %s: %v", what, d, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
