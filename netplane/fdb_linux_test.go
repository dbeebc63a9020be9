package netplane

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/guard"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// inOwnSysfs runs f on a thread of its own in namespace host, with a
// sysfs mounted there (as `ip netns exec` does), so that /sys/class/net
// shows host's links. The thread is never used again, and is put back in
// its namespaces first: should it be the process's main thread, which Go
// keeps, a namespace deleted later must not list the test process as one
// of its own (testutil.NS.Delete kills those).
func inOwnSysfs(t *testing.T, host *testutil.NS, f func() error) error {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // and never unlocked: the thread ends with the goroutine
		origNet, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer origNet.Close()
		origMnt, err := os.Open("/proc/thread-self/ns/mnt")
		if err != nil {
			errc <- err
			return
		}
		defer origMnt.Close()
		defer func() {
			unix.Setns(int(origMnt.Fd()), unix.CLONE_NEWNS)
			netns.Set(origNet)
		}()
		h, err := netns.GetFromName(host.Name)
		if err != nil {
			errc <- err
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			errc <- err
			return
		}
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			errc <- err
			return
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			errc <- err
			return
		}
		if err := unix.Mount("sysfs", "/sys", "sysfs", 0, ""); err != nil {
			errc <- err
			return
		}
		errc <- f()
	}()
	return <-errc
}

// TestBridgeFDB: every port's entries read from the bridge's brforward
// file are those the kernel dumps port by port (hostnet.FDBOf), for a bridge of
// more than 256 ports (port numbers past 8 bits); the ports' own entries
// are left out. Where sysfs shows another namespace it refuses, and
// portMACs reads one dump of the bridge's (hostnet.FDBOfBridge). portMACs of more ports than it reads one
// by one (a project's status) gives those ports' entries alone, both
// ways.
func TestBridgeFDB(t *testing.T) {
	needRoot(t)
	host := testutil.NewNS(t, "fdb")
	const ports = 260
	var batch strings.Builder
	fmt.Fprintf(&batch, "link add br-fdb type bridge\nlink set br-fdb up\n")
	for i := range ports {
		fmt.Fprintf(&batch, "link add f%d type veth peer name g%d\nlink set f%d master br-fdb\n", i, i, i)
	}
	file := filepath.Join(t.TempDir(), "batch")
	if err := os.WriteFile(file, []byte(batch.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	host.MustRun(t, "ip", "-batch", file)
	want := map[string][]string{
		"f0":   {"52:55:55:00:14:01", "52:55:55:00:14:02"},
		"f1":   {"52:55:55:00:14:03"},
		"f259": {"52:55:55:00:14:04"},
	}
	for port, macs := range want {
		for _, mac := range macs {
			host.MustRun(t, "bridge", "fdb", "add", mac, "dev", port, "master", "static")
		}
	}
	check := func(got map[string][]string, how string) {
		t.Helper()
		for port := range got {
			slices.Sort(got[port])
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: %v, want %v", how, got, want)
		}
	}
	// f0 and f259 of many asked (f1 not), past bulkPorts.
	asked := []string{"f0", "f259", "no-such-port"}
	for i := range bulkPorts {
		asked = append(asked, fmt.Sprintf("f%d", 100+i))
	}
	wantAsked := map[string][]string{"f0": want["f0"], "f259": want["f259"]}
	checkAsked := func(got map[string][]string, how string) {
		t.Helper()
		for port := range got {
			slices.Sort(got[port])
		}
		if fmt.Sprint(got) != fmt.Sprint(wantAsked) {
			t.Errorf("%s: %v, want %v", how, got, wantAsked)
		}
	}
	var bySysfs, byPort, askedBySysfs map[string][]string
	err := inOwnSysfs(t, host, func() error {
		br, err := netlink.LinkByName("br-fdb")
		if err != nil {
			return err
		}
		brPorts, err := hostnet.PortsOf(br.Attrs().Index)
		if err != nil {
			return err
		}
		// The bridge's ports alone (not their veth peers, nor the
		// bridge), each with a port number of its own.
		nos := map[uint16]bool{}
		for _, p := range brPorts {
			if p.Master != br.Attrs().Index || !strings.HasPrefix(p.Name, "f") || p.PortNo == 0 || nos[p.PortNo] {
				return fmt.Errorf("PortsOf(br-fdb) lists %+v", p)
			}
			nos[p.PortNo] = true
		}
		if len(brPorts) != ports {
			return fmt.Errorf("PortsOf(br-fdb): %d ports, want %d", len(brPorts), ports)
		}
		fdb, err := guard.BridgeFDB(br, brPorts)
		if err != nil {
			return err
		}
		bySysfs = map[string][]string{}
		for idx, macs := range fdb {
			l, err := netlink.LinkByIndex(idx)
			if err != nil {
				return err
			}
			for _, m := range macs {
				bySysfs[l.Attrs().Name] = append(bySysfs[l.Attrs().Name], m.String())
			}
		}
		byPort = portMACs("br-fdb", nil)
		askedBySysfs = portMACs("br-fdb", asked)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	check(bySysfs, "bridgeFDB")
	check(byPort, "portMACs of every port, through sysfs")
	checkAsked(askedBySysfs, "portMACs of many ports, through sysfs")
	host.MustDo(t, func() error {
		br, err := netlink.LinkByName("br-fdb")
		if err != nil {
			return err
		}
		if _, err := guard.BridgeFDB(br, nil); err == nil {
			return fmt.Errorf("bridgeFDB read another namespace's sysfs")
		}
		check(portMACs("br-fdb", nil), "portMACs of every port, in one dump")
		checkAsked(portMACs("br-fdb", asked), "portMACs of many ports, in one dump")
		return nil
	})
}
