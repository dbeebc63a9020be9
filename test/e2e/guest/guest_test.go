package guest

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/test/testutil"
)

func TestQuote(t *testing.T) {
	for in, want := range map[string]string{
		"eth0":      "eth0",
		"10.0.0.1":  "10.0.0.1",
		"":          "''",
		"a b":       "'a b'",
		"it's":      `'it'\''s'`,
		"$(reboot)": "'$(reboot)'",
	} {
		if got := Quote(in); got != want {
			t.Errorf("Quote(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestScriptText(t *testing.T) {
	got := NewScript().DHCP("eth0").Ping("10.99.0.1").Echo("10.0.0.2", 7, "hi there", 1500e6).Report("k", "cat /x").String()
	want := "e2e_dhcp eth0\ne2e_ping 10.99.0.1\ne2e_echo 10.0.0.2 7 'hi there' 2\ne2e_report k \"$({ cat /x; } | tr '\\n' ' ')\"\n"
	if got != want {
		t.Errorf("script:\n%s\nwant:\n%s", got, want)
	}
}

func TestScriptBackground(t *testing.T) {
	got := NewScript().Background(NewScript().SLAAC("eth0", "fd00:1::/64", 30e9).Ping("fd00:1::1")).Background(NewScript()).Wait().String()
	want := "{\ne2e_slaac eth0 fd00:1::/64 30\ne2e_ping fd00:1::1\n} &\nwait\n"
	if got != want {
		t.Errorf("script:\n%s\nwant:\n%s", got, want)
	}
}

func TestParseConsole(t *testing.T) {
	g := &Guest{values: map[string]string{}, finished: make(chan struct{}), logFile: mustTemp(t)}
	for _, l := range []string{
		"[    1.0] random kernel line\r\n",
		"E2E boot uptime=1.2\n",
		"E2E eth0.ip=10.99.0.12 \n",
		"noise E2E ping.10.99.0.1=ok\n",
		"E2E eth0.ip=10.99.0.13\n",
		"E2E fail no DHCP lease on eth0\n",
		"E2E fail script exited with status 1\n",
	} {
		g.line(l)
	}
	want := map[string]string{"eth0.ip": "10.99.0.13", "ping.10.99.0.1": "ok"}
	if !reflect.DeepEqual(g.values, want) {
		t.Errorf("values %v, want %v", g.values, want)
	}
	if g.done || g.failure != "no DHCP lease on eth0" || g.bootTime == 0 {
		t.Errorf("done %v failure %q boot %v", g.done, g.failure, g.bootTime)
	}
	select {
	case <-g.finished:
	default:
		t.Error("finished not closed")
	}
}

func mustTemp(t *testing.T) *os.File {
	f, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func TestCPIOReadableByCpio(t *testing.T) {
	testutil.RequireCommands(t, "cpio")
	cpio, err := exec.LookPath("cpio")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := writeCPIO(&buf, withParents([]cpioEntry{
		{Name: "e2e/script.sh", Mode: modeRegular | 0o644, Data: []byte("echo hi\n")},
		{Name: "bin/sh", Mode: modeSymlink | 0o777, Data: []byte("/bin/busybox")},
		{Name: "dev/console", Mode: modeCharDev | 0o600, Major: 5, Minor: 1},
	})); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(cpio, "-it", "--quiet")
	cmd.Stdin = &buf
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("cpio -it: %v", err)
	}
	if got, want := strings.Fields(string(out)), []string{"bin", "bin/sh", "dev", "dev/console", "e2e", "e2e/script.sh"}; !reflect.DeepEqual(got, want) {
		t.Errorf("cpio lists %v, want %v", got, want)
	}
}

func TestResolveModules(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"modules.dep": "kernel/a/virtio_net.ko: kernel/b/net_failover.ko kernel/c/failover.ko kernel/d/virtio.ko\n" +
			"kernel/b/net_failover.ko: kernel/c/failover.ko\nkernel/c/failover.ko:\nkernel/d/virtio.ko:\n",
		"modules.builtin":          "kernel/e/virtio_pci.ko\n",
		"kernel/a/virtio_net.ko":   "net",
		"kernel/b/net_failover.ko": "nf",
		"kernel/c/failover.ko":     "f",
		"kernel/d/virtio.ko":       "v",
	}
	for name, data := range files {
		os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mods, err := resolveModules(dir, []string{"virtio_pci", "virtio-net"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range mods {
		names = append(names, m.name)
	}
	if want := []string{"failover", "net_failover", "virtio", "virtio_net"}; !reflect.DeepEqual(names, want) {
		t.Errorf("load order %v, want %v", names, want)
	}
	if _, err := resolveModules(dir, []string{"nope"}); err == nil {
		t.Error("unknown module: no error")
	}
}

func TestVersionLess(t *testing.T) {
	if !versionLess("/boot/vmlinuz-6.1.0-9-amd64", "/boot/vmlinuz-6.1.0-56-amd64") {
		t.Error("6.1.0-9 should sort before 6.1.0-56")
	}
	if versionLess("vmlinuz-6.10.0", "vmlinuz-6.9.0") {
		t.Error("6.10 should sort after 6.9")
	}
}

func TestPVHKernel(t *testing.T) {
	var opts ImageOptions
	if err := opts.fill(); errors.Is(err, ErrMissing) {
		testutil.Missing(t, err.Error(), setupHint)
	} else if err != nil {
		t.Fatal(err)
	}
	sum, err := hashFile(opts.Kernel)
	if err != nil {
		t.Fatal(err) // the kernel was found: failing to read it is no missing prerequisite
	}
	start := time.Now()
	path, err := pvhKernel(opts.Kernel, sum, t.TempDir())
	if err != nil {
		t.Fatalf("%s: %v", opts.Kernel, err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s → %s (%d bytes) in %v", opts.Kernel, path, fi.Size(), time.Since(start).Round(time.Millisecond))
	if err := checkPVH([]byte("not an ELF")); err == nil {
		t.Error("checkPVH accepted garbage")
	}
}
