package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/test/e2e/guest"
)

// TestVhostUserGuest: a qemu guest whose attachment is `attach:
// vhost-user` boots with the arguments `vmnetctl args --memory` prints
// (its memory shared, qemu -netdev vhost-user on the helper's socket),
// gets its lease over the rings, pings its gateway, resolves a name
// through it and echoes a line with a server behind the NAT; then qemu ends and a second qemu (a VMM restarted) connects
// to the same helper, which serves it as well.
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
	boot := func(name string) *guest.Result {
		return guest.Boot(t, guest.Config{
			Name:     name,
			Netns:    w.Name,
			NetArgs:  tcgArgs(args),
			MemoryMB: 256,
			Script: guest.NewScript().DHCP("eth0").Ping(sharedGW).
				ResolveWithin("vu.vmnet.internal", sharedGW, time.Minute).
				Echo(wanPeer, wanPort, "over-the-rings-"+name, time.Minute),
		}).MustWait(t)
	}
	srv := serveEcho(t, w.wan, fmt.Sprintf("%s:%d", wanPeer, wanPort))
	for _, name := range []string{"vu", "vu-again"} {
		r := boot(name)
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
