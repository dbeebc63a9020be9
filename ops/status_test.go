package ops

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/statedir"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// The attachments table says whether each VM is there (PEER) and how long
// ago its last frame came (LAST FRAME); "-" where the helper does not run
// or no frame came.
func TestStatusTablePeer(t *testing.T) {
	now := time.Date(2026, 11, 24, 3, 0, 0, 0, time.UTC)
	st := &ctlapi.Status{
		Controller: ctlapi.ControllerStatus{Running: true, PID: 42, UptimeSeconds: 600, StateDir: "/run/vmnetctl"},
		Networks: []ctlapi.NetworkStatus{{Name: "shared", Mode: "shared", Bridge: "vmn-shared", Subnet: "192.168.105.0/24", Gateway: "192.168.105.1",
			State: "up", Leases: 1, VMs: []string{"a", "b", "c", "d"}}},
		Attachments: []ctlapi.AttachmentStatus{
			{VM: "a", Network: "shared", MAC: "52:55:55:00:00:0a", Socket: "/run/vmnetctl/vms/a/0.sock", IP: "192.168.105.10", PID: 100,
				State: ctlapi.StateRunning, UptimeSeconds: 300, Peer: "connected", LastFrameAt: now.Add(-3 * time.Second)},
			{VM: "b", Network: "shared", MAC: "52:55:55:00:00:0b", Socket: "/run/vmnetctl/vms/b/0.sock", PID: 101,
				State: ctlapi.StateRunning, UptimeSeconds: 300, Peer: "waiting for VM"},
			{VM: "c", Index: 0, Network: "shared", MAC: "52:55:55:00:00:0c", Socket: "/run/vmnetctl/vms/c/0.sock", PID: 102,
				State: ctlapi.StateRunning, UptimeSeconds: 300, Peer: "VM gone", LastFrameAt: now.Add(-125 * time.Second)},
			{VM: "d", Network: "shared", MAC: "52:55:55:00:00:0d", Attach: "tap", Tap: "vmt-d", State: "stopped"},
		},
	}
	var out bytes.Buffer
	if err := renderStatus(&out, st, now); err != nil {
		t.Fatal(err)
	}
	testutil.Golden(t, filepath.Join("testdata", "status-peers.txt"), out.String())
}

// TestStatusPolicies: after the tables, status says what each network's
// egress policy is and what it refused, and each attachment's own policy,
// port forwards and bandwidth limits; `up`'s table of a project, those of
// its attachments.
func TestStatusPolicies(t *testing.T) {
	st := &ctlapi.Status{
		Controller: ctlapi.ControllerStatus{Running: true, PID: 42, UptimeSeconds: 60, StateDir: "/run/vmnetctl"},
		Networks: []ctlapi.NetworkStatus{{Name: "sandbox", Mode: "shared", Bridge: "vmn-sandbox", Subnet: "10.88.0.0/24", Gateway: "10.88.0.1",
			State: "up", VMs: []string{"agent", "web"}, Egress: "{default: deny, allow: [pypi.org]}", EgressDenied: 7}},
		Attachments: []ctlapi.AttachmentStatus{
			{VM: "agent", Network: "sandbox", Project: "ai", MAC: "52:55:55:00:00:0a", Socket: "/run/vmnetctl/vms/agent/0.sock", State: ctlapi.StateRunning,
				Egress: "none", EgressDenied: 3, Bandwidth: &api.Bandwidth{ToVM: 100_000_000, FromVM: 20_000_000}},
			{VM: "web", Network: "sandbox", Project: "site", MAC: "52:55:55:00:00:0b", Socket: "/run/vmnetctl/vms/web/0.sock", State: ctlapi.StateRunning,
				Forwards: []ctlapi.ForwardStatus{{Forward: "127.0.0.1:8080 -> 80/tcp", Connections: 12}}},
		},
	}
	var out bytes.Buffer
	if err := renderStatus(&out, st, time.Now()); err != nil {
		t.Fatal(err)
	}
	out.WriteString("$ up -p ai\n")
	if err := RenderProject(&out, st, "ai"); err != nil {
		t.Fatal(err)
	}
	testutil.Golden(t, filepath.Join("testdata", "status-policies.txt"), out.String())
}

// A user whose own state dir holds nothing, while root's is in use, is told
// to use sudo, not that nothing is running.
func TestStatusRootsStateDirInUse(t *testing.T) {
	defer func(r string, e func() int) { rootStateDir, euid = r, e }(rootStateDir, euid)
	rootStateDir, euid = t.TempDir(), func() int { return 1000 }
	mine := statedir.Dir{Path: t.TempDir()}
	if _, err := OfflineStatus(context.Background(), mine); err != nil {
		t.Fatalf("nothing in root's state dir either: %v", err)
	}
	root := statedir.Dir{Path: rootStateDir}
	os.MkdirAll(filepath.Dir(root.APISocket()), 0o755)
	if err := os.WriteFile(root.APISocket(), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := OfflineStatus(context.Background(), mine); err == nil || !strings.Contains(err.Error(), "run with sudo (sudo vmnetctl status)") {
		t.Errorf("root's controller serves, this user's state dir is empty: %v, want run with sudo", err)
	}
	euid = func() int { return 0 }
	if _, err := OfflineStatus(context.Background(), mine); err != nil {
		t.Errorf("as root, with a state dir of its choosing: %v", err)
	}
}

// TestDescribeForwardsEgress: describe's text shows an attachment's port
// forwards with their connections, and its egress policy with the
// connections it refused ("the network's" when the VM file sets none).
func TestDescribeForwardsEgress(t *testing.T) {
	d := &Description{VM: "web", Attachments: []AttachmentDescription{{
		AttachmentStatus: ctlapi.AttachmentStatus{VM: "web", Network: "shared", State: ctlapi.StateRunning, EgressDenied: 3,
			Forwards: []ctlapi.ForwardStatus{{Forward: "127.0.0.1:8080 -> 80/tcp", Connections: 2}, {Forward: "0.0.0.0:5353 -> 53/udp"}},
			Egress:   "default deny, allow pypi.org"},
	}, {
		AttachmentStatus: ctlapi.AttachmentStatus{VM: "web", Index: 1, Network: "sandbox", State: ctlapi.StateRunning, EgressDenied: 1},
	}}}
	var b strings.Builder
	if err := d.Render(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"  forwards:    127.0.0.1:8080 -> 80/tcp (2 connections)\n",
		"               0.0.0.0:5353 -> 53/udp (0 connections)\n",
		"  egress:      default deny, allow pypi.org; 3 connections refused\n",
		"  egress:      the network's; 1 connections refused\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("describe lacks %q:\n%s", want, b.String())
		}
	}
}

// TestInspectEgress: network inspect's text shows the network's egress
// policy, in plan's words, and nothing of the kind without one.
func TestInspectEgress(t *testing.T) {
	nets, diags := api.LoadNetworks("networks.yaml", []byte("vmnet:\n  sandbox:\n    subnet: 10.9.0.0/24\n    egress:\n      default: deny\n      allow: [10.1.0.0/16]\n  open:\n    subnet: 10.8.0.0/24\n"))
	if err := diags.Err(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		id, want string
	}{{"sandbox", "egress:    " + nets.Get("sandbox").Egress.String() + "\n"}, {"open", ""}} {
		var b strings.Builder
		if err := (&NetworkInfo{Name: tc.id, Config: nets.Get(tc.id), State: "up"}).Render(&b); err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(b.String(), "egress:"); got != (tc.want != "") || tc.want != "" && !strings.Contains(b.String(), tc.want) {
			t.Errorf("network inspect %s:\n%s\nwant %q", tc.id, b.String(), tc.want)
		}
	}
	if nets.Get("sandbox").Egress.String() == "" {
		t.Error("the policy's words are empty")
	}
}
