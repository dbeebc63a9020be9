package guest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

var netnsSeq atomic.Int64

// NewNetns creates a throwaway named network namespace (loopback up) and
// deletes it on test cleanup, after cleanups registered later (processes
// started in it) have run. It skips the test unless running as root with
// iproute2.
func NewNetns(tb testing.TB) string {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root (network namespaces)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		tb.Skip("needs iproute2")
	}
	name := fmt.Sprintf("vmne2e-%d-%d", os.Getpid(), netnsSeq.Add(1))
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		tb.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	tb.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			tb.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	NetnsRun(tb, name, "ip", "link", "set", "lo", "up")
	return name
}

// NetnsRun runs a command in the namespace and fails the test if it fails.
func NetnsRun(tb testing.TB, ns string, args ...string) string {
	tb.Helper()
	full := append([]string{"netns", "exec", ns}, args...)
	out, err := exec.Command("ip", full...).CombinedOutput()
	if err != nil {
		tb.Fatalf("ip %s: %v: %s", strings.Join(full, " "), err, out)
	}
	return string(out)
}

// NetnsStart starts a long-running command in the namespace and kills it on
// test cleanup. Its combined output goes to logPath.
func NetnsStart(tb testing.TB, ns, logPath string, args ...string) *exec.Cmd {
	tb.Helper()
	log, err := os.Create(logPath)
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		log.Close()
		tb.Fatalf("%s: %v", strings.Join(cmd.Args, " "), err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); log.Close(); close(done) }()
	tb.Cleanup(func() { cmd.Process.Kill(); <-done })
	return cmd
}

// WaitFor polls cond every 20 ms until it returns true or timeout passes,
// then fails the test with what.
func WaitFor(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// NetnsListeningUDP reports whether something in the namespace listens on
// the UDP port (from /proc/net/udp).
func NetnsListeningUDP(ns string, port int) bool {
	out, err := exec.Command("ip", "netns", "exec", ns, "cat", "/proc/net/udp").Output()
	return err == nil && strings.Contains(string(out), fmt.Sprintf(":%04X ", port))
}

// NetnsListeningTCP reports whether something in the namespace listens on
// the TCP port (from /proc/net/tcp and tcp6, state 0A).
func NetnsListeningTCP(ns string, port int) bool {
	out, err := exec.Command("ip", "netns", "exec", ns, "cat", "/proc/net/tcp", "/proc/net/tcp6").Output()
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) > 3 && strings.HasSuffix(f[1], fmt.Sprintf(":%04X", port)) && f[3] == "0A" {
			return true
		}
	}
	return false
}

// InNetns runs fn on an OS thread switched into the named namespace, then
// switches the thread back. Sockets fn creates stay in the namespace, so it
// is the way to listen there from the test process.
func InNetns(ns string, fn func() error) error {
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	target, err := os.Open("/run/netns/" + ns)
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("setns %s: %w", ns, err)
	}
	fnErr := fn()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		// Leave the thread locked: it dies with its goroutine.
		return fmt.Errorf("setns back: %w", err)
	}
	runtime.UnlockOSThread()
	return fnErr
}

// ListenUDPInNetns opens a UDP socket bound to addr inside the namespace and
// closes it on test cleanup.
func ListenUDPInNetns(tb testing.TB, ns, addr string) net.PacketConn {
	tb.Helper()
	var pc net.PacketConn
	if err := InNetns(ns, func() (err error) { pc, err = net.ListenPacket("udp4", addr); return err }); err != nil {
		tb.Fatalf("listen udp %s in %s: %v", addr, ns, err)
	}
	tb.Cleanup(func() { pc.Close() })
	return pc
}
