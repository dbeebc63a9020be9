package api

import (
	"net/netip"
	"strings"
	"testing"
)

const forwardNets = "vmnet:\n  shared:\n    subnet: 10.1.0.0/24\n  lan:\n    mode: bridged\n    interface: eth0\n"

// loadForwards loads VM files and resolves them against forwardNets.
func loadForwards(t *testing.T, files ...string) ([]*VMFile, error) {
	t.Helper()
	nets := mustNetworks(t, forwardNets)
	var vfs []*VMFile
	var diags Diagnostics
	for i, src := range files {
		vf, d := LoadVMFile([]string{"a.yaml", "b.yaml"}[i], []byte(src), VMFileOptions{})
		diags = append(diags, d...)
		if vf != nil {
			vfs = append(vfs, vf)
		}
	}
	if err := diags.Err(); err != nil {
		return nil, err
	}
	return vfs, Resolve(nets, vfs).Err()
}

// TestPortForwards reads lima's portForwards keys on a VM's network entry:
// defaults (tcp, 127.0.0.1, the guest's port), ranges, and clear errors,
// two forwards of one host port among them, with both places named.
func TestPortForwards(t *testing.T) {
	vfs, err := loadForwards(t, `vms:
  web:
    networks:
      - vmnet: shared
        portForwards:
          - guestPort: 80
            hostPort: 8080
            hostIP: 0.0.0.0
          - guestPort: 53
            proto: udp
          - guestPortRange: [9000, 9009]
            hostPortRange: [19000, 19009]
`)
	if err != nil {
		t.Fatal(err)
	}
	got := vfs[0].VMs[0].Attachments[0].PortForwards
	want := []string{"0.0.0.0:8080 -> 80/tcp", "127.0.0.1:53 -> 53/udp", "127.0.0.1:19000-19009 -> 9000-9009/tcp"}
	if len(got) != len(want) {
		t.Fatalf("forwards %v, want %v", got, want)
	}
	for i := range want {
		if got[i].String() != want[i] {
			t.Errorf("forward %d = %s, want %s", i, got[i], want[i])
		}
	}
	if got[0].HostIP != netip.IPv4Unspecified() || got[0].Source.Line != 6 {
		t.Errorf("forward 0: %+v", got[0])
	}

	entry := func(body string) string {
		return "vms:\n  web:\n    networks:\n      - vmnet: shared\n        portForwards:\n" + body
	}
	for _, c := range []struct{ name, src, other, want string }{
		{"no guest port", entry("          - hostPort: 8080\n"), "", "a.yaml:6: vms.web.networks[0].portForwards[0]: needs guestPort or guestPortRange"},
		{"bad port", entry("          - guestPort: 70000\n"), "", "70000 is not a port (1-65535)"},
		{"uneven ranges", entry("          - guestPortRange: [1, 10]\n            hostPortRange: [100, 105]\n"), "", "maps 6 host ports onto 10 guest ports"},
		{"too many ports", entry("          - guestPortRange: [1000, 3000]\n"), "", "forwards 2001 ports; at most 1024"},
		{"proto", entry("          - guestPort: 80\n            proto: sctp\n"), "", `must be tcp or udp, not "sctp"`},
		{"both port keys", entry("          - guestPort: 80\n            guestPortRange: [80, 81]\n"), "", "conflicts with guestPort"},
		{"DNS port on every address", entry("          - guestPort: 53\n            proto: udp\n            hostIP: 0.0.0.0\n"), "", "host port 53/udp on every address (0.0.0.0) would take the connections of vmnetctl's DNS proxy"},
		{"DHCP port in a range", entry("          - guestPortRange: [60, 70]\n            proto: udp\n            hostIP: 0.0.0.0\n"), "", "host port 67/udp on every address"},
		{"a gateway", entry("          - guestPort: 80\n            hostIP: 10.1.0.1\n"), "", `hostIP 10.1.0.1 is the gateway of network "shared"`},
		{"bridged", "vms:\n  web:\n    networks:\n      - vmnet: lan\n        portForwards:\n          - guestPort: 80\n", "", `network "lan" is bridged`},
		{"one host port twice", entry("          - guestPort: 80\n            hostPort: 8080\n"),
			"vms:\n  api:\n    networks:\n      - vmnet: shared\n        portForwards:\n          - guestPort: 81\n            hostPort: 8080\n            hostIP: 0.0.0.0\n",
			"b.yaml:6: vms.api.networks[0].portForwards: host port 8080/tcp on 0.0.0.0 is also forwarded at a.yaml:6"},
	} {
		files := []string{c.src}
		if c.other != "" {
			files = append(files, c.other)
		}
		if _, err := loadForwards(t, files...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
	// The same port on two addresses, or over tcp and udp, is two forwards.
	if _, err := loadForwards(t, entry("          - guestPort: 80\n            hostPort: 8080\n            hostIP: 127.0.0.1\n          - guestPort: 81\n            hostPort: 8080\n            hostIP: 10.9.9.9\n          - guestPort: 80\n            hostPort: 8080\n            proto: udp\n")); err != nil {
		t.Errorf("distinct forwards: %v", err)
	}
}
