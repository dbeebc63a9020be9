package testutil

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

func TestNS(t *testing.T) {
	a, b := NewNS(t, "a"), NewNS(t, "b")
	if a.Name == b.Name {
		t.Fatalf("two namespaces named %s", a.Name)
	}
	if out := a.MustRun(t, "ip", "-br", "link"); !strings.HasPrefix(out, "lo ") || strings.Count(out, "\n") != 1 || !strings.Contains(out, "UNKNOWN") {
		t.Errorf("a new namespace has only lo, up:\n%s", out)
	}
	Run(t, "ip", "-n", a.Name, "link", "add", "veth-a", "type", "veth", "peer", "name", "veth-b", "netns", b.Name)
	a.MustRun(t, "ip", "addr", "add", "10.250.0.1/24", "dev", "veth-a")
	b.MustRun(t, "ip", "addr", "add", "10.250.0.2/24", "dev", "veth-b")
	a.MustRun(t, "ip", "link", "set", "veth-a", "up")
	b.MustRun(t, "ip", "link", "set", "veth-b", "up")

	// A listener opened with Do is in the namespace: b reaches it, a's
	// own loopback listens and the host's does not.
	ln := a.Listen(t, "tcp4", "10.250.0.1:0")
	port := ln.Addr().(*net.TCPAddr).Port
	if !a.ListeningTCP(port) || b.ListeningTCP(port) {
		t.Errorf("ListeningTCP(%d): a %v, b %v", port, a.ListeningTCP(port), b.ListeningTCP(port))
	}
	pc := b.ListenPacket(t, "udp4", "10.250.0.2:0")
	if !b.ListeningUDP(pc.LocalAddr().(*net.UDPAddr).Port) {
		t.Errorf("ListeningUDP: b's socket is not seen")
	}
	Eventually(t, 10*time.Second, func() error { return b.Ping("10.250.0.1", 1) }, "b to reach a")

	// Delete kills what runs in the namespace and removes it.
	sleeper := b.Start(t, t.TempDir()+"/sleep.log", "sleep", "600")
	Eventually(t, 5*time.Second, func() bool { return len(b.Pids()) == 1 }, "sleep to run in b")
	path := b.Path()
	b.Delete()
	Eventually(t, 5*time.Second, func() bool {
		_, err := os.Stat(fmt.Sprintf("/proc/%d", sleeper.Process.Pid))
		return os.IsNotExist(err)
	}, "Delete to kill sleep (pid %d)", sleeper.Process.Pid)
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("%s after Delete: %v", path, err)
	}
	if _, err := b.Run(context.Background(), "true"); err == nil {
		t.Errorf("ip netns exec %s works after Delete", b.Name)
	}
}
