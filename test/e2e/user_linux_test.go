package e2e

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/launch"
	"github.com/vmnetctl/vmnetctl/statedir"
	"github.com/vmnetctl/vmnetctl/test/e2e/guest"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// The unprivileged user the VMs belong to in TestGuestsAsUser, as if
// `sudo vmnetctl up` had been run by them.
const (
	vmUID = 65534 // nobody
	vmGID = 65534
)

// userImage copies the shared image's kernel and base initramfs into dir
// (readable by everyone): the cache may be in root's home, which qemu
// running as another user cannot enter.
func userImage(t *testing.T, dir string) *guest.Image {
	t.Helper()
	src := guest.SharedImage(t)
	img := *src
	cp := func(from string) string {
		to := filepath.Join(dir, filepath.Base(from))
		if err := os.Link(from, to); err == nil {
			return to
		}
		in, err := os.Open(from)
		if err != nil {
			t.Fatal(err)
		}
		defer in.Close()
		out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(out, in); err != nil {
			t.Fatal(err)
		}
		if err := out.Close(); err != nil {
			t.Fatal(err)
		}
		return to
	}
	img.BootKernel = cp(src.BootKernel)
	img.Initrd = cp(src.Initrd)
	return &img
}

// TestGuestsAsUser is the way vmnetctl is meant to be used: `sudo vmnetctl
// up` and `sudo vmnetctl run` by a user, whose VMs run as that user, not
// root. vmnetctl runs as root with SUDO_UID/SUDO_GID set; qemu runs as that
// user (setpriv for the VM of `up`; `run` drops to the user itself). Two
// guests at once:
//
//	u: `up`, qemu as the user with `vmnetctl args u --vmm qemu`: eth0 on a
//	   unix datagram socket (shared), eth1 on a TAP (jumbo), eth2 on a
//	   stream socket (iso, -netdev stream: lima's way on Linux); all must
//	   be usable by the user.
//	r: `run`, qemu as the user with the socketpair on fd 4.
//
// Each gets its lease on every NIC and pings the gateway.
func TestGuestsAsUser(t *testing.T) {
	t.Parallel()
	start := time.Now()
	testutil.RequireCommands(t, "setpriv")
	w := newWorld(t)
	// The user must be able to reach STATE/vms/VM/, as under /run.
	if err := os.Chmod(w.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	imgDir := filepath.Join(w.Dir, "image")
	if err := os.Mkdir(imgDir, 0o755); err != nil {
		t.Fatal(err)
	}
	img := userImage(t, imgDir)
	work := filepath.Join(w.Dir, "work")
	if err := os.Mkdir(work, 0o755); err != nil {
		t.Fatal(err)
	}
	sudo := []string{fmt.Sprintf("SUDO_UID=%d", vmUID), fmt.Sprintf("SUDO_GID=%d", vmGID)}
	asUser := func(args ...string) []string {
		return append(append([]string{"env"}, sudo...), w.VmnetctlArgs(args...)...)
	}

	vms := w.WriteFile("user.yaml", `vms:
  u:
    networks:
      - vmnet: shared
      - vmnet: jumbo
        attach: tap
      - vmnet: iso
        attach: stream
`)
	runFile := w.WriteFile("user-run.yaml", `vms:
  r:
    networks:
      - vmnet: shared
        macAddress: "52:55:55:e2:01:00"
`)
	up := asUser("up", "-f", vms)
	if out, err := w.Command(context.Background(), up[0], up[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("sudo vmnetctl up (SUDO_UID=%d): %v\n%s", vmUID, err, out)
	}
	st, err := w.ReadStatus()
	if err != nil {
		t.Fatal(err)
	}
	vmDir := filepath.Join(w.StateDir(), "vms", "u")
	if fi, err := os.Stat(vmDir); err != nil {
		t.Fatal(err)
	} else if uid := statUID(fi); uid != vmUID {
		t.Errorf("%s belongs to uid %d, want %d", vmDir, uid, vmUID)
	}
	for _, a := range st.Attachments {
		t.Logf("%s/%d: %s %s %s", a.VM, a.Index, a.Attach, a.Socket, a.Tap)
		if a.VM != "u" || a.Socket == "" {
			continue
		}
		// The controller set the helper up itself and started only its
		// relay (helper.Prepare): the socket and its lock are the user's,
		// as a helper that dropped to them makes them, and the relay runs
		// as the user, not dumpable (/proc shows its descriptors as root's).
		for _, path := range []string{a.Socket, a.Socket + ".lock"} {
			if fi, err := os.Lstat(path); err != nil {
				t.Error(err)
			} else if uid := statUID(fi); uid != vmUID || fi.Mode().Perm() != 0o600 {
				t.Errorf("%s: uid %d, mode %v; want uid %d, mode 0600", path, uid, fi.Mode().Perm(), vmUID)
			}
		}
		// (/proc/PID itself always shows the process's euid.)
		if fi, err := os.Stat(fmt.Sprintf("/proc/%d/fd", a.PID)); err != nil {
			t.Error(err)
		} else if uid := statUID(fi); uid != 0 {
			t.Errorf("u/%d's relay (pid %d) is dumpable: /proc/%d/fd is uid %d's", a.Index, a.PID, a.PID, uid)
		}
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", a.PID)); err != nil {
			t.Error(err)
		} else if !strings.Contains(string(b), fmt.Sprintf("\nUid:\t%d\t%d\t%d\t%d\n", vmUID, vmUID, vmUID, vmUID)) {
			t.Errorf("u/%d's relay (pid %d) does not run as uid %d:\n%s", a.Index, a.PID, vmUID, b)
		}
		if b, err := os.ReadFile(statedir.Dir{Path: w.StateDir()}.HelperLogFile(fmt.Sprintf("u/%d", a.Index))); err != nil {
			t.Error(err)
		} else if !strings.Contains(string(b), "set up by the controller") {
			t.Errorf("u/%d's helper was not set up by the controller; its log:\n%s", a.Index, b)
		}
	}

	mkScript := func() *guest.Script {
		return guest.NewScript().DHCP("eth0").Ping(sharedGW)
	}
	u := guest.Boot(t, guest.Config{
		Name:    "u",
		Image:   img,
		WorkDir: work,
		Netns:   w.Name,
		Wrapper: []string{"setpriv", "--reuid", fmt.Sprint(vmUID), "--regid", fmt.Sprint(vmGID), "--clear-groups", "--"},
		NetArgs: w.qemuArgs("u"),
		Script:  mkScript().DHCP("eth1").Ping(jumboGW).DHCP("eth2").Ping(isoGW),
	})
	r := guest.Boot(t, guest.Config{
		Name:    "r",
		Image:   img,
		WorkDir: work,
		Netns:   w.Name,
		Wrapper: asUser("run", "-f", runFile, "--vm", "r", "--"),
		NetArgs: guest.NetDgramFD("net0", launch.FirstVMFD, "52:55:55:e2:01:00"),
		Script:  mkScript(),
	})
	ru, rr := u.MustWait(t), r.MustWait(t)
	for _, res := range []*guest.Result{ru, rr} {
		res.Expect(t, "eth0.dhcp", "ok")
		res.Expect(t, "eth0.router", sharedGW)
		res.Expect(t, guest.PingKey(sharedGW), "ok")
		// shared's DHCP pool: after the gateway to .254 (docs/configuration.md).
		if err := testutil.InRange(res.Values["eth0.ip"], "10.61.0.2", "10.61.0.254"); err != nil {
			t.Errorf("%s: eth0.ip: %v", res.Name, err)
		}
	}
	// u is still up: its lease is the one status reports for it.
	testutil.Eventually(t, 20*time.Second, func() error {
		st, err := w.ReadStatus()
		if err != nil {
			return err
		}
		for _, a := range st.Attachments {
			if a.VM == "u" && a.Index == 0 {
				if a.IP != ru.Values["eth0.ip"] {
					return fmt.Errorf("u's eth0 leased %q, status says %q", ru.Values["eth0.ip"], a.IP)
				}
				return nil
			}
		}
		return fmt.Errorf("status has no u/0: %+v", st.Attachments)
	}, "status to report u's lease")
	ru.Expect(t, "eth1.dhcp", "ok")
	ru.Expect(t, "eth1.router", jumboGW)
	ru.Expect(t, guest.PingKey(jumboGW), "ok")
	// eth2 is qemu's -netdev stream client of the helper's stream socket
	// (attach: stream, as lima's socket: networks connect).
	ru.Expect(t, "eth2.dhcp", "ok")
	ru.Expect(t, "eth2.router", isoGW)
	ru.Expect(t, guest.PingKey(isoGW), "ok")
	if rr.ExitCode != 0 {
		t.Errorf("vmnetctl run exited with %d, want 0", rr.ExitCode)
	}
	// qemu ran as the user: the socket it bound is the user's.
	if fi, err := os.Stat(filepath.Join(vmDir, "0.vm.sock")); err != nil {
		t.Error(err)
	} else if uid := statUID(fi); uid != vmUID {
		t.Errorf("qemu's socket belongs to uid %d, want %d", uid, vmUID)
	}
	t.Logf("u: boot %v, run %v; r: boot %v, run %v; test %v",
		ru.BootTime.Round(time.Millisecond), ru.Elapsed.Round(time.Millisecond),
		rr.BootTime.Round(time.Millisecond), rr.Elapsed.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}

func statUID(fi os.FileInfo) int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid)
	}
	return -1
}
