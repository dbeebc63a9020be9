package e2e

import (
	"crypto/md5"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/test/testutil"

	"github.com/vmnetctl/vmnetctl/test/e2e/guest"
)

// TestVhostUserGuest: a qemu guest whose attachment is `attach:
// vhost-user` boots with the arguments `vmnetctl args --memory` prints
// (its memory shared, qemu -netdev vhost-user on the helper's socket),
// gets its lease over the rings, pings its gateway, resolves a name
// through it and echoes a line with a server behind the NAT; then qemu
// ends and a second qemu (a VMM restarted) connects to the same helper,
// which serves it as well. The second guest's device takes no offloads:
// it downloads 2 MiB from behind the NAT, which the host's stack hands
// the helper's TAP in 64 KiB packets and the helper cuts into its frames,
// and gets every byte (its kernel checks each frame's checksums).
func TestVhostUserGuest(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	const mac = "52:55:55:e6:00:01"
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(w.StateDir(), "helpers", "vu.0.log"))
			t.Logf("the helper's log:\n%s", b)
		}
	})
	w.MustVmnetctl("up", "-f", w.WriteFile("vu.yaml", "vms:\n  vu:\n    networks:\n      - vmnet: shared\n        attach: vhost-user\n        macAddress: \""+mac+"\"\n"))
	out := strings.TrimSpace(w.MustVmnetctl("args", "vu", "--vmm", "qemu", "--memory", "256M"))
	if strings.ContainsAny(out, `'"\`) {
		t.Fatalf("args vu: quoted words: %s", out)
	}
	args := strings.Fields(out)
	if !strings.Contains(out, "-netdev vhost-user,id=net0,chardev=net0-vu") || !strings.Contains(out, "share=on") {
		t.Fatalf("args vu --memory 256M: %s", out)
	}
	blob := make([]byte, 2<<20)
	for i := range blob {
		blob[i] = byte(i*7 + i>>11)
	}
	const blobPort = 8083
	go http.Serve(w.wan.Listen(t, "tcp4", fmt.Sprintf("%s:%d", wanPeer, blobPort)), http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		rw.Write(blob)
	}))
	boot := func(name string, offloads bool) *guest.Result {
		script := guest.NewScript().DHCP("eth0").Ping(sharedGW).
			ResolveWithin("vu.vmnet.internal", sharedGW, time.Minute).
			Echo(wanPeer, wanPort, "over-the-rings-"+name, time.Minute)
		netArgs := tcgArgs(args)
		if !offloads {
			for i, a := range netArgs {
				if strings.HasPrefix(a, "virtio-net-pci,") {
					netArgs[i] = a + ",csum=off,guest_csum=off,guest_tso4=off,guest_tso6=off,host_tso4=off,host_tso6=off"
				}
			}
			script.Report("blob.md5", fmt.Sprintf("wget -q -O - http://%s:%d/blob | md5sum | cut -d' ' -f1", wanPeer, blobPort))
		}
		return guest.Boot(t, guest.Config{Name: name, Netns: w.Name, NetArgs: netArgs, MemoryMB: 256, Script: script}).MustWait(t)
	}
	srv := serveEcho(t, w.wan, fmt.Sprintf("%s:%d", wanPeer, wanPort))
	for _, name := range []string{"vu", "vu-again"} {
		r := boot(name, name == "vu")
		if name == "vu-again" {
			r.Expect(t, "blob.md5", fmt.Sprintf("%x", md5.Sum(blob)))
		}
		r.Expect(t, guest.EchoKey(wanPeer, wanPort), "ok")
		r.Expect(t, "eth0.dhcp", "ok")
		r.Expect(t, guest.PingKey(sharedGW), "ok")
		ip, _ := r.Get("eth0.ip")
		if !strings.HasPrefix(ip, "10.61.0.") {
			t.Errorf("%s: eth0.ip %q, not shared's", name, ip)
		}
		r.Expect(t, guest.ResolveKey("vu.vmnet.internal"), ip)
		t.Logf("%s: boot %v, run %v", name, r.BootTime.Round(time.Millisecond), r.Elapsed.Round(time.Millisecond))
	}
	if peers, data := srv.sources(); len(peers) != 2 || !slices.Contains(data, "over-the-rings-vu") {
		t.Errorf("the WAN's echo server saw %v from %v, want both guests' lines, NATed", data, peers)
	}
	log, _ := os.ReadFile(filepath.Join(w.StateDir(), "helpers", "vu.0.log"))
	if !strings.Contains(string(log), "the guest takes offloads csum, guest_csum, guest_tso4, guest_tso6, host_tso4, host_tso6") ||
		!strings.Contains(string(log), "the guest takes no offloads (the port's TCP segments cut into its frames here)") {
		t.Errorf("the helper's log does not say that the first guest took offloads and the second none:\n%s", log)
	}
	st, err := w.ReadStatus()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range st.Attachments {
		if a.VM == "vu" && a.Restarts != 0 {
			t.Errorf("the helper restarted %d times: one helper serves both VMMs", a.Restarts)
		}
	}
}

// tcgArgs are args for qemu under TCG: its virtio-net device without
// MSI-X (vectors=0), since qemu 7.2 crashes (msix_set_vector_notifiers,
// from vhost_net_start) setting vhost-user's notifiers up for MSI-X
// without KVM.
func tcgArgs(args []string) []string {
	out := slices.Clone(args)
	for i, a := range out {
		if strings.HasPrefix(a, "virtio-net-pci,") {
			out[i] = a + ",vectors=0"
		}
	}
	return out
}

// TestVhostUserHelperRestarts: the helper under a running qemu guest is
// killed; the controller starts it again on the same socket, qemu
// reconnects (reconnect=1) and sets the rings up anew, and the guest,
// which leased and pinged before, reaches a server behind the NAT after,
// with the same port and lease.
func TestVhostUserHelperRestarts(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.MustVmnetctl("up", "-f", w.WriteFile("vu.yaml", "vms:\n  vr:\n    networks:\n      - vmnet: shared\n        attach: vhost-user\n        macAddress: \"52:55:55:e6:00:02\"\n"))
	args := tcgArgs(strings.Fields(strings.TrimSpace(w.MustVmnetctl("args", "vr", "--vmm", "qemu", "--memory", "256M"))))
	g := guest.Boot(t, guest.Config{
		Name:     "vr",
		Netns:    w.Name,
		NetArgs:  args,
		MemoryMB: 256,
		// The echo server comes only after the helper is back: the
		// guest's tries until then are refused, and it keeps trying.
		Script: guest.NewScript().DHCP("eth0").Ping(sharedGW).
			Echo(wanPeer, wanPort, "after-the-restart", 3*time.Minute),
	})
	if v, err := g.Await(guest.PingKey(sharedGW), 3*time.Minute); err != nil || v != "ok" {
		t.Fatalf("the guest's ping before the restart: %q, %v", v, err)
	}
	// status says the VMM is there (the helper's log says it came).
	testutil.Eventually(t, time.Minute, func() error {
		if p := w.Attachment(w.Status(), "vr").Peer; p != "connected" {
			return fmt.Errorf("peer %q", p)
		}
		return nil
	}, "status to say the VM is connected")
	before := w.Attachment(w.Status(), "vr")
	if err := syscall.Kill(before.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, func() error {
		if a := w.Attachment(w.Status(), "vr"); a.PID == before.PID || a.State != ctlapi.StateRunning {
			return fmt.Errorf("helper pid %d, %s", a.PID, a.State)
		}
		return nil
	}, "the helper started again")
	srv := serveEcho(t, w.wan, fmt.Sprintf("%s:%d", wanPeer, wanPort))
	r := g.MustWait(t)
	r.Expect(t, "eth0.dhcp", "ok")
	r.Expect(t, guest.EchoKey(wanPeer, wanPort), "ok")
	if _, data := srv.sources(); !slices.Contains(data, "after-the-restart") {
		t.Errorf("the WAN's echo server saw %v", data)
	}
	// qemu exited with the guest: status says the VM went.
	testutil.Eventually(t, time.Minute, func() error {
		if p := w.Attachment(w.Status(), "vr").Peer; p != "VM gone" {
			return fmt.Errorf("peer %q", p)
		}
		return nil
	}, "status to say the VM went")
}
