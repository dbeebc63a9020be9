package controller

import (
	"bytes"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// The attachments table says whether each VM is there (PEER) and how long
// ago its last frame came (LAST FRAME); "-" where the helper does not run
// or no frame came.
func TestStatusTablePeer(t *testing.T) {
	now := time.Date(2026, 11, 24, 3, 0, 0, 0, time.UTC)
	st := &Status{
		Controller: ControllerStatus{Running: true, PID: 42, UptimeSeconds: 600, StateDir: "/run/vmnetctl"},
		Networks: []NetworkStatus{{Name: "shared", Mode: "shared", Bridge: "vmn-shared", Subnet: "192.168.105.0/24", Gateway: "192.168.105.1",
			State: "up", Leases: 1, VMs: []string{"a", "b", "c", "d"}}},
		Attachments: []AttachmentStatus{
			{VM: "a", Network: "shared", MAC: "52:55:55:00:00:0a", Socket: "/run/vmnetctl/vms/a/0.sock", IP: "192.168.105.10", PID: 100,
				State: StateRunning, UptimeSeconds: 300, Peer: "connected", LastFrameAt: now.Add(-3 * time.Second)},
			{VM: "b", Network: "shared", MAC: "52:55:55:00:00:0b", Socket: "/run/vmnetctl/vms/b/0.sock", PID: 101,
				State: StateRunning, UptimeSeconds: 300, Peer: "waiting for VM"},
			{VM: "c", Index: 0, Network: "shared", MAC: "52:55:55:00:00:0c", Socket: "/run/vmnetctl/vms/c/0.sock", PID: 102,
				State: StateRunning, UptimeSeconds: 300, Peer: "VM gone", LastFrameAt: now.Add(-125 * time.Second)},
			{VM: "d", Network: "shared", MAC: "52:55:55:00:00:0d", Attach: "tap", Tap: "vmt-d", State: "stopped"},
		},
	}
	var out bytes.Buffer
	if err := st.render(&out, now); err != nil {
		t.Fatal(err)
	}
	testutil.Golden(t, filepath.Join("testdata", "status-peers.txt"), out.String())
}
