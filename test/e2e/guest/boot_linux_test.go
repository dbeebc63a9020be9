package guest

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The boot tests need no root: guests are wired to each other directly.

// TestBootSocketpair connects two guests with a datagram socketpair, each
// end inherited by one qemu (-netdev dgram,local.type=fd).
func TestBootSocketpair(t *testing.T) {
	start := time.Now()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	a, b := os.NewFile(uintptr(fds[0]), "a"), os.NewFile(uintptr(fds[1]), "b")
	defer a.Close()
	defer b.Close()
	runPair(t, start,
		Config{Name: "fd-a", ExtraFiles: []*os.File{a}, NetArgs: NetDgramFD("n0", FD(0), MAC(0x21))},
		Config{Name: "fd-b", ExtraFiles: []*os.File{b}, NetArgs: NetDgramFD("n0", FD(0), MAC(0x22))})
}

// TestBootDgramUnix connects two guests with unix datagram sockets bound by
// qemu (-netdev dgram,local.type=unix), each sending to the other's path.
func TestBootDgramUnix(t *testing.T) {
	start := time.Now()
	dir, err := os.MkdirTemp("", "e2e-dgram-") // short: sun_path is 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	pa, pb := filepath.Join(dir, "a.sock"), filepath.Join(dir, "b.sock")
	runPair(t, start,
		Config{Name: "unix-a", NetArgs: NetDgramUnix("n0", pa, pb, MAC(0x31))},
		Config{Name: "unix-b", NetArgs: NetDgramUnix("n0", pb, pa, MAC(0x32))})
}

func runPair(t *testing.T, start time.Time, ca, cb Config) {
	SharedImage(t)
	ca.Script = NewScript().Addr("eth0", "10.98.0.1/24").Listen(7).AwaitConns(7, 1, 150*time.Second)
	cb.Script = NewScript().Addr("eth0", "10.98.0.2/24").Echo("10.98.0.1", 7, "over-the-wire", 150*time.Second).Ping("10.98.0.1")
	ga, gb := Boot(t, ca), Boot(t, cb)
	ra, rb := ga.MustWait(t), gb.MustWait(t)
	ra.Expect(t, ListenKey(7)+".data", "over-the-wire")
	rb.Expect(t, EchoKey("10.98.0.1", 7), "ok")
	rb.Expect(t, PingKey("10.98.0.1"), "ok")
	t.Logf("boot %v / %v, run %v / %v, test %v", ra.BootTime.Round(time.Millisecond), rb.BootTime.Round(time.Millisecond),
		ra.Elapsed.Round(time.Millisecond), rb.Elapsed.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}

// TestBootTimeout: a guest that does not finish in time is killed and the
// error says so and carries the qemu command and console tail.
func TestBootTimeout(t *testing.T) {
	g := Boot(t, Config{Name: "slow", Script: NewScript().Sh("sleep 600"), Timeout: time.Second})
	r, err := g.Wait()
	if err == nil {
		t.Fatal("no error from a guest that timed out")
	}
	for _, want := range []string{"timed out after 1s", "qemu-system-x86_64", "console ("} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	if r.Done || r.Elapsed > 30*time.Second {
		t.Errorf("done %v elapsed %v", r.Done, r.Elapsed)
	}
}
