package vmnethelper

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/backend"
)

func TestBackendRefusesTap(t *testing.T) {
	_, err := Backend{Path: "/x"}.HelperCommand(backend.HelperSpec{Attachment: tapAttachment()})
	if err != ErrTapNeedsLinux {
		t.Errorf("tap attachment: %v", err)
	}
}

func tapAttachment() *api.Attachment {
	return &api.Attachment{VM: "fc", Attach: api.AttachTAP, MAC: "52:55:55:00:00:01"}
}

func TestVMNetHelperLeases(t *testing.T) {
	file := filepath.Join(t.TempDir(), "dhcpd_leases")
	exp := time.Now().Add(time.Hour).Unix()
	data := fmt.Sprintf("{\n\tname=web\n\tip_address=192.168.105.7\n\thw_address=1,52:55:55:1:2:3\n\tidentifier=1,52:55:55:1:2:3\n\tlease=0x%x\n}\n"+
		"{\n\tname=other\n\tip_address=192.168.64.9\n\thw_address=1,52:55:55:0:0:9\n\tidentifier=1,52:55:55:0:0:9\n\tlease=0x%x\n}\n", exp, exp)
	if err := os.WriteFile(file, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	nets, diags := api.LoadNetworks("n.yaml", []byte("vmnet:\n  shared:\n    subnet: 192.168.105.0/24\n"))
	if diags.HasErrors() {
		t.Fatal(diags.Err())
	}
	nw, err := Backend{LeasesFile: file}.StartNetwork(context.Background(), nets.Get("shared"), backend.NetworkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	leases := nw.Leases()
	if len(leases) != 1 || leases[0].MAC != "52:55:55:01:02:03" || leases[0].IP.String() != "192.168.105.7" || leases[0].Hostname != "web" {
		t.Errorf("leases = %+v, want web's only (the other is outside the subnet)", leases)
	}
	// The same from the file alone, without a running network (`vmnetctl
	// leases`, the offline status); none without the file.
	stored, err := Backend{LeasesFile: file}.StoredLeases(nets.Get("shared"), backend.NetworkOptions{})
	if err != nil || len(stored) != 1 || stored[0] != leases[0] {
		t.Errorf("stored leases = %+v, %v; want %+v", stored, err, leases)
	}
	if none, err := (Backend{LeasesFile: file + ".none"}).StoredLeases(nets.Get("shared"), backend.NetworkOptions{}); err != nil || len(none) != 0 {
		t.Errorf("without bootpd's file: %+v, %v; want none", none, err)
	}
}

func TestVMNetHelperSudoRefusesAUserOwnedHelper(t *testing.T) {
	fake := filepath.Join(t.TempDir(), "vmnet-helper")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		os.Chown(fake, 65534, 65534) // owned by nobody: not root's
	}
	nets, _ := api.LoadNetworks("n.yaml", []byte("vmnet:\n  shared:\n    subnet: 192.168.105.0/24\n"))
	a := &api.Attachment{VM: "dev", MAC: "52:55:55:00:00:01", Attach: api.AttachSocket}
	_, err := Backend{Path: fake, Sudo: true}.HelperCommand(backend.HelperSpec{Attachment: a, Network: nets.Get("shared"), Socket: "/tmp/x.sock", FD: -1})
	if err == nil {
		t.Fatal("a vmnet-helper that a user can replace would run as root")
	}
}

func TestVMNetHelperBrokerAndOffloads(t *testing.T) {
	nets, diags := api.LoadNetworks("n.yaml", []byte("vmnet:\n  shared:\n    subnet: 192.168.105.0/24\n    offloads: true\n  brokered:\n    subnet: 192.168.106.0/24\n    vmnetBroker: lima-shared\n    isolation: true\n"))
	if diags.HasErrors() {
		t.Fatal(diags.Err())
	}
	a := &api.Attachment{VM: "dev", MAC: "52:55:55:00:00:01", Attach: api.AttachSocket}
	b := Backend{Path: "/opt/vmnet-helper/bin/vmnet-helper"}
	argv, err := b.HelperCommand(backend.HelperSpec{Attachment: a, Network: nets.Get("shared"), Socket: "/tmp/x.sock", FD: -1})
	if got := strings.Join(argv, " "); err != nil || !strings.Contains(got, "--enable-tso") || !strings.Contains(got, "--enable-checksum-offload") {
		t.Errorf("offloads: %q %v", got, err)
	}
	argv, err = b.HelperCommand(backend.HelperSpec{Attachment: a, Network: nets.Get("brokered"), Socket: "/tmp/x.sock", FD: -1})
	// vmnet-helper takes --enable-isolation with --network and ignores
	// --interface-id there.
	if got := strings.Join(argv, " "); err != nil || !strings.Contains(got, "--network lima-shared") || strings.Contains(got, "--operation-mode") ||
		!strings.Contains(got, "--enable-isolation") || strings.Contains(got, "--interface-id") {
		t.Errorf("broker network: %q %v", got, err)
	}
}

// TestLimitsWarnOfLinuxSettings: what only the Linux data plane does, an
// attachment's bandwidth, port forwards and impairment among it, is a
// warning on macOS, each named, never silently dropped.
func TestLimitsWarnOfLinuxSettings(t *testing.T) {
	a := &api.Attachment{VM: "vm", MAC: "52:55:55:00:00:02", Network: "shared",
		Bandwidth:    &api.Bandwidth{},
		PortForwards: []api.PortForward{{}},
		Impair:       &api.Impairment{LossToVM: api.LossScale / 10}}
	var got []string
	for _, l := range (Backend{}).Limits(nil, []*api.Attachment{a}) {
		if l.Refused {
			t.Errorf("refused: %s", l.Message)
		}
		got = append(got, l.Message)
	}
	for _, want := range []string{"bandwidth cannot be honoured", "portForwards cannot be honoured", "impair cannot be honoured"} {
		if !strings.Contains(strings.Join(got, "\n"), want) {
			t.Errorf("Limits = %q, want a warning %q", got, want)
		}
	}
}
