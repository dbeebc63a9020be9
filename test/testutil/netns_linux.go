package testutil

import (
	"context"
	"fmt"
	"io"
	"net"
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

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// NS is a network namespace made by a test: a named namespace (bind-mounted
// under /var/run/netns), so that `ip netns exec NAME` and `ip -n NAME` reach
// it, removed, with every process in it killed, when the test ends.
//
// Go code enters it through containernetworking/plugins' pkg/ns (NetNS.Do
// locks the goroutine to an OS thread, switches it and switches it back, or
// lets the thread die when it cannot: the one piece every namespace test
// needs right). It is made by `ip netns add`, not by pkg/testutils.NewNS:
// that one leaves its OS thread locked so that the thread exits, and a child
// started earlier from that thread with Pdeathsig (qemu, daemons) would be
// killed with it.
type NS struct {
	// Name is the namespace's name for iproute2 (`ip netns exec Name`):
	// the label, the test process's pid and a sequence number.
	Name string
	// Label is what the test called it.
	Label string

	netns  ns.NetNS
	tb     testing.TB
	delete sync.Once
}

var nsSeq atomic.Int64

// NewNS creates a network namespace with loopback up, labelled label in
// its name, and deletes it on test cleanup, after the cleanups registered
// later (processes started in it) have run. It needs root and iproute2:
// without them the test skips, or fails with CI=true.
func NewNS(tb testing.TB, label string) *NS {
	tb.Helper()
	RequireRoot(tb, "creates network namespaces")
	RequireCommands(tb, "ip")
	name := fmt.Sprintf("%s-%d-%d", label, os.Getpid(), nsSeq.Add(1))
	Run(tb, "ip", "netns", "add", name)
	nn, err := ns.GetNS(filepath.Join(netnsDir, name))
	if err != nil {
		exec.Command("ip", "netns", "delete", name).Run()
		tb.Fatalf("network namespace %s: %v", name, err)
	}
	n := &NS{Name: name, Label: label, netns: nn, tb: tb}
	tb.Cleanup(n.Delete)
	n.MustRun(tb, "ip", "link", "set", "lo", "up")
	return n
}

// netnsDir is where iproute2 mounts named namespaces.
const netnsDir = "/var/run/netns"

// String is the namespace's name, for messages.
func (n *NS) String() string { return "netns " + n.Name }

// Path is the namespace's bind mount (for setns, slirp4netns --netns-type=path...).
func (n *NS) Path() string { return n.netns.Path() }

// NetNS is the namespace as containernetworking/plugins' pkg/ns sees it.
func (n *NS) NetNS() ns.NetNS { return n.netns }

// Do runs f on an OS thread that is inside the namespace. Sockets f opens
// stay in the namespace. f runs on another goroutine: it must not call
// t.Fatal.
func (n *NS) Do(f func() error) error {
	return n.netns.Do(func(ns.NetNS) error { return f() })
}

// Pids lists the processes running in the namespace.
func (n *NS) Pids() []int {
	out, err := exec.Command("ip", "netns", "pids", n.Name).Output()
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
			pids = append(pids, pid)
		}
	}
	return pids
}

// Delete kills every process in the namespace and removes it. It is called
// on test cleanup; calling it again does nothing.
func (n *NS) Delete() {
	n.delete.Do(func() {
		for _, pid := range n.Pids() {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		n.netns.Close()
		// A lazy unmount, as `ip netns delete` does: a process killed just
		// now may still hold the mount for a moment (unmount would fail
		// with EBUSY); the namespace goes when its last user does.
		if err := unix.Unmount(n.Path(), unix.MNT_DETACH); err != nil {
			n.tb.Errorf("removing %s: unmount: %v", n, err)
		}
		if err := os.Remove(n.Path()); err != nil {
			n.tb.Errorf("removing %s: %v", n, err)
		}
	})
}

// Command returns a command that runs inside the namespace (through `ip
// netns exec`, which also gives it the namespace's /sys).
func (n *NS) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
}

// Run runs a command inside the namespace and returns its combined output;
// the error has the output too.
func (n *NS) Run(ctx context.Context, name string, args ...string) (string, error) {
	out, err := n.Command(ctx, name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s in %s: %w: %s", name, strings.Join(args, " "), n, err, out)
	}
	return string(out), nil
}

// MustRun is Run that fails the test on error.
func (n *NS) MustRun(tb testing.TB, name string, args ...string) string {
	tb.Helper()
	out, err := n.Run(context.Background(), name, args...)
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// Start starts a long-running command in the namespace, its combined output
// to logPath, and kills it on test cleanup. The kernel kills it too if the
// test process dies.
func (n *NS) Start(tb testing.TB, logPath, name string, args ...string) *exec.Cmd {
	tb.Helper()
	log, err := os.Create(logPath)
	if err != nil {
		tb.Fatal(err)
	}
	cmd := n.Command(context.Background(), name, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		tb.Fatalf("%s in %s: %v", strings.Join(cmd.Args, " "), n, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); log.Close(); close(done) }()
	tb.Cleanup(func() { cmd.Process.Kill(); <-done })
	return cmd
}

// Ping sends count pings to addr from the namespace and returns an error
// unless all are answered.
func (n *NS) Ping(addr string, count int) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(count+10)*time.Second)
	defer cancel()
	_, err := n.Run(ctx, "ping", "-n", "-q", "-c", strconv.Itoa(count), "-W", "2", addr)
	return err
}

// MustDo runs f in the namespace and fails the test on error. f must not
// call tb.Fatal: it runs on another goroutine.
func (n *NS) MustDo(tb testing.TB, f func() error) {
	tb.Helper()
	if err := n.Do(f); err != nil {
		tb.Fatalf("in %s: %v", n, err)
	}
}

// Listen opens a stream listener (tcp, tcp4, unix...) inside the namespace
// and closes it on test cleanup.
func (n *NS) Listen(tb testing.TB, network, addr string) net.Listener {
	tb.Helper()
	return listenIn(tb, n, network, addr, net.Listen)
}

// ListenPacket opens a packet socket (udp, udp4...) inside the namespace
// and closes it on test cleanup.
func (n *NS) ListenPacket(tb testing.TB, network, addr string) net.PacketConn {
	tb.Helper()
	return listenIn(tb, n, network, addr, net.ListenPacket)
}

func listenIn[C io.Closer](tb testing.TB, n *NS, network, addr string, listen func(network, addr string) (C, error)) C {
	tb.Helper()
	var c C
	if err := n.Do(func() (err error) { c, err = listen(network, addr); return err }); err != nil {
		tb.Fatalf("listen %s %s in %s: %v", network, addr, n, err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

// ListeningUDP reports whether something in the namespace listens on the
// UDP port (from the namespace's /proc/net/udp and udp6).
func (n *NS) ListeningUDP(port int) bool {
	return n.listening(port, "", "/proc/net/udp", "/proc/net/udp6")
}

// ListeningTCP reports whether something in the namespace listens on the
// TCP port (from /proc/net/tcp and tcp6, state 0A).
func (n *NS) ListeningTCP(port int) bool {
	return n.listening(port, "0A", "/proc/net/tcp", "/proc/net/tcp6")
}

func (n *NS) listening(port int, state string, files ...string) bool {
	var out []byte
	err := n.Do(func() error {
		for _, f := range files {
			// /proc/net follows the reading thread's namespace.
			b, err := os.ReadFile(filepath.Join("/proc/thread-self/net", filepath.Base(f)))
			if err != nil && !os.IsNotExist(err) { // no udp6 without IPv6
				return err
			}
			out = append(out, b...)
		}
		return nil
	})
	if err != nil {
		return false
	}
	suffix := fmt.Sprintf(":%04X", port)
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) > 3 && strings.HasSuffix(f[1], suffix) && (state == "" || f[3] == state) {
			return true
		}
	}
	return false
}

// Exchange connects over TCP to addr from inside the namespace, sends
// send (if any) and closes its side, and returns all it reads back: a
// test's client of a simple service. Dialing waits 3 s at most, the
// exchange 5 s.
func (n *NS) Exchange(addr, send string) (string, error) {
	var got string
	err := n.Do(func() error {
		c, err := net.DialTimeout("tcp", addr, 3*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if send != "" {
			if _, err := io.WriteString(c, send); err != nil {
				return err
			}
			c.(*net.TCPConn).CloseWrite()
		}
		b, err := io.ReadAll(c)
		got = string(b)
		return err
	})
	return got, err
}

// LinkStats is link name's counters in the namespace.
func (n *NS) LinkStats(tb testing.TB, name string) netlink.LinkStatistics {
	tb.Helper()
	var s netlink.LinkStatistics
	if err := n.Do(func() error {
		l, err := netlink.LinkByName(name)
		if err == nil {
			s = *l.Attrs().Statistics
		}
		return err
	}); err != nil {
		tb.Fatal(err)
	}
	return s
}
