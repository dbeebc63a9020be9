package ops

import (
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/statedir"
)

func TestVMMArgs(t *testing.T) {
	sd := statedir.Dir{Path: "/run/vmnetctl"}
	sock := []ctlapi.AttachmentStatus{
		{VM: "web", Index: 0, Network: "shared", MAC: "52:55:55:00:00:01", Attach: "socket", Socket: "/run/vmnetctl/vms/web/0.sock"},
		{VM: "web", Index: 1, Network: "host", MAC: "52:55:55:00:00:02", Attach: "socket", Socket: "/run/vmnetctl/vms/web/1.sock"},
	}
	tap := []ctlapi.AttachmentStatus{
		{VM: "fc", Index: 0, Network: "shared", MAC: "52:55:55:00:00:03", Attach: "tap", Tap: "vmt-0123456789"},
	}
	stream := []ctlapi.AttachmentStatus{
		{VM: "lm", Index: 0, Network: "shared", MAC: "52:55:55:00:00:05", Attach: "stream", Socket: "/run/vmnetctl/vms/lm/0.sock"},
	}
	// A socket, a TAP and a socket again under `vmnetctl run`: the TAP is
	// descriptor 5, its vhost-net descriptor comes after the three.
	mixed := []ctlapi.AttachmentStatus{sock[0], {VM: "web", Index: 1, Network: "shared", MAC: "52:55:55:00:00:04", Attach: "tap"}, sock[1]}
	mixed[2].Index = 2
	tests := []struct {
		vmm   string
		atts  []ctlapi.AttachmentStatus
		fds   bool
		want  string
		vhost bool
	}{
		{"qemu", sock, false, "-netdev dgram,id=net0,local.type=unix,local.path=/run/vmnetctl/vms/web/0.vm.sock,remote.type=unix,remote.path=/run/vmnetctl/vms/web/0.sock -device virtio-net-pci,netdev=net0,mac=52:55:55:00:00:01 " +
			"-netdev dgram,id=net1,local.type=unix,local.path=/run/vmnetctl/vms/web/1.vm.sock,remote.type=unix,remote.path=/run/vmnetctl/vms/web/1.sock -device virtio-net-pci,netdev=net1,mac=52:55:55:00:00:02", false},
		{"qemu", sock, true, "-netdev dgram,id=net0,local.type=fd,local.str=4 -device virtio-net-pci,netdev=net0,mac=52:55:55:00:00:01 -netdev dgram,id=net1,local.type=fd,local.str=5 -device virtio-net-pci,netdev=net1,mac=52:55:55:00:00:02", false},
		{"qemu", tap, false, "-netdev tap,id=net0,ifname=vmt-0123456789,script=no,downscript=no -device virtio-net-pci,netdev=net0,mac=52:55:55:00:00:03", false},
		{vmm: "qemu", atts: mixed, fds: true, want: "-netdev dgram,id=net0,local.type=fd,local.str=4 -device virtio-net-pci,netdev=net0,mac=52:55:55:00:00:01 " +
			"-netdev tap,id=net1,fd=5 -device virtio-net-pci,netdev=net1,mac=52:55:55:00:00:04 " +
			"-netdev dgram,id=net2,local.type=fd,local.str=6 -device virtio-net-pci,netdev=net2,mac=52:55:55:00:00:02"},
		{vmm: "qemu", atts: mixed, fds: true, vhost: true, want: "-netdev dgram,id=net0,local.type=fd,local.str=4 -device virtio-net-pci,netdev=net0,mac=52:55:55:00:00:01 " +
			"-netdev tap,id=net1,fd=5,vhost=on,vhostfd=7 -device virtio-net-pci,netdev=net1,mac=52:55:55:00:00:04 " +
			"-netdev dgram,id=net2,local.type=fd,local.str=6 -device virtio-net-pci,netdev=net2,mac=52:55:55:00:00:02"},
		{"vfkit", sock[:1], false, "--device virtio-net,unixSocketPath=/run/vmnetctl/vms/web/0.sock,mac=52:55:55:00:00:01", false},
		{"krunkit", sock[:1], false, "--device virtio-net,type=unixgram,path=/run/vmnetctl/vms/web/0.sock,mac=52:55:55:00:00:01", false},
		{"cloud-hypervisor", tap, false, "--net tap=vmt-0123456789,mac=52:55:55:00:00:03", false},
		{"firecracker", tap, false, `[{"iface_id":"net0","host_dev_name":"vmt-0123456789","guest_mac":"52:55:55:00:00:03"}]`, false},
		{"qemu", stream, false, "-netdev stream,id=net0,server=off,addr.type=unix,addr.path=/run/vmnetctl/vms/lm/0.sock -device virtio-net-pci,netdev=net0,mac=52:55:55:00:00:05", false},
		{"lima", stream, false, "networks:\n- socket: \"/run/vmnetctl/vms/lm/0.sock\"\n  macAddress: \"52:55:55:00:00:05\"", false},
	}
	for _, tt := range tests {
		got, err := vmmArgs(sd, tt.vmm, tt.atts, tt.fds, tt.vhost, "")
		if err != nil || strings.Join(got, " ") != tt.want {
			t.Errorf("%s (fds=%v, vhost=%v):\n got %s (%v)\nwant %s", tt.vmm, tt.fds, tt.vhost, strings.Join(got, " "), err, tt.want)
		}
	}
	// vhost-user: qemu shares the guest's memory (once, for every such
	// attachment) and connects to the helper's socket; cloud-hypervisor
	// too; a VMM that does not speak it, or no --memory, is an error.
	vu := []ctlapi.AttachmentStatus{
		{VM: "vu", Index: 0, Network: "shared", MAC: "52:55:55:00:00:06", Attach: "vhost-user", Socket: "/run/vmnetctl/vms/vu/0.sock"},
		{VM: "vu", Index: 1, Network: "host", MAC: "52:55:55:00:00:07", Attach: "vhost-user", Socket: "/run/vmnetctl/vms/vu/1.sock"},
	}
	if got, err := vmmArgs(sd, "qemu", vu, false, false, "2G"); err != nil || strings.Join(got, " ") != "-object memory-backend-memfd,id=vmnetctl-mem,size=2G,share=on -machine memory-backend=vmnetctl-mem "+
		"-chardev socket,id=net0-vu,path=/run/vmnetctl/vms/vu/0.sock,reconnect=1 -netdev vhost-user,id=net0,chardev=net0-vu -device virtio-net-pci,netdev=net0,mac=52:55:55:00:00:06 "+
		"-chardev socket,id=net1-vu,path=/run/vmnetctl/vms/vu/1.sock,reconnect=1 -netdev vhost-user,id=net1,chardev=net1-vu -device virtio-net-pci,netdev=net1,mac=52:55:55:00:00:07" {
		t.Errorf("qemu, vhost-user: %s (%v)", strings.Join(got, " "), err)
	}
	if got, err := vmmArgs(sd, "cloud-hypervisor", vu[:1], false, false, ""); err != nil || strings.Join(got, " ") != "--net vhost_user=true,socket=/run/vmnetctl/vms/vu/0.sock,vhost_mode=client,mac=52:55:55:00:00:06" {
		t.Errorf("cloud-hypervisor, vhost-user: %s (%v)", strings.Join(got, " "), err)
	}
	if _, err := vmmArgs(sd, "qemu", vu, false, false, ""); err == nil || !strings.Contains(err.Error(), "give --memory") {
		t.Errorf("qemu, vhost-user without --memory: %v", err)
	}
	if _, err := vmmArgs(sd, "vfkit", vu, false, false, "2G"); err == nil || !strings.Contains(err.Error(), "does not speak vhost-user") {
		t.Errorf("vfkit, vhost-user: %v", err)
	}
	if _, err := vmmArgs(sd, "firecracker", sock, false, false, ""); err == nil || !strings.Contains(err.Error(), "attach: tap") {
		t.Errorf("firecracker with a socket attachment: %v", err)
	}
	if _, err := vmmArgs(sd, "lima", sock, false, false, ""); err == nil || !strings.Contains(err.Error(), "attach: stream") {
		t.Errorf("lima with a datagram socket attachment: %v", err)
	}
	if _, err := vmmArgs(sd, "vfkit", stream, false, false, ""); err == nil || !strings.Contains(err.Error(), "attach: stream") {
		t.Errorf("vfkit with a stream attachment: %v", err)
	}
	failed := []ctlapi.AttachmentStatus{{VM: "web", Index: 0, Network: "shared", MAC: "52:55:55:00:00:01", Attach: "socket", State: "failed", Error: "network shared is not up"}}
	if _, err := vmmArgs(sd, "qemu", failed, false, false, ""); err == nil || !strings.Contains(err.Error(), "web's attachment 0 to shared is failed, so it has no socket yet: network shared is not up") {
		t.Errorf("args of a failed attachment: %v", err)
	}
	// A comma in the state dir's path: doubled for qemu, refused for
	// vfkit, whose options have no escape.
	comma := statedir.Dir{Path: "/run/a,remote.path=/evil"}
	odd := []ctlapi.AttachmentStatus{{VM: "web", Index: 0, Network: "shared", MAC: "52:55:55:00:00:01", Attach: "socket", Socket: comma.SocketPath("web", 0)}}
	got, err := vmmArgs(comma, "qemu", odd, false, false, "")
	if want := "local.path=/run/a,,remote.path=/evil/vms/web/0.vm.sock,remote.type=unix,remote.path=/run/a,,remote.path=/evil/vms/web/0.sock"; err != nil || !strings.Contains(strings.Join(got, " "), want) {
		t.Errorf("qemu with a comma in the path: %q (%v), want it doubled", got, err)
	}
	if _, err := vmmArgs(comma, "vfkit", odd, false, false, ""); err == nil || !strings.Contains(err.Error(), "comma") {
		t.Errorf("vfkit with a comma in the path: %v, want refused", err)
	}
	if got := shellQuote("/tmp/my dir/x.sock"); got != `'/tmp/my dir/x.sock'` {
		t.Errorf("shellQuote = %s", got)
	}
}
