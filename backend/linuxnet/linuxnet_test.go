package linuxnet

import (
	"slices"
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/backend"
	"github.com/vmnetctl/vmnetctl/hostnet"
)

func TestHelperCommand(t *testing.T) {
	nets, diags := api.LoadNetworks("n.yaml", []byte("vmnet:\n  shared:\n    subnet: 192.168.105.0/24\n    offloads: true\n  host:\n    mode: host\n    subnet: 192.168.106.0/24\n    isolation: true\n"))
	if diags.HasErrors() {
		t.Fatal(diags.Err())
	}
	a := &api.Attachment{VM: "dev", MAC: "52:55:55:00:00:01", MACDerived: true, Attach: api.AttachSocket}
	id := api.InterfaceID(a.VM, a.Index, a.MAC)
	for _, tc := range []struct {
		name string
		spec backend.HelperSpec
		want string
	}{
		{"socket with offloads", backend.HelperSpec{Executable: "vmnetctl", Attachment: a, Network: nets.Get("shared"), UID: -1, Socket: "/tmp/x.sock", FD: -1, NetworksFile: "/s/networks.yaml", StatsFile: "/s/helpers/dev.0.stats", ShapingFile: "/s/helpers/dev.0.shaping"},
			"vmnetctl helper --networks /s/networks.yaml --network shared --interface-id " + id + " --tap " + api.TapName(id) + " --stats-interval 0 --log-timestamps --stats-file /s/helpers/dev.0.stats --shaping-file /s/helpers/dev.0.shaping --enable-tso --enable-checksum-offload --socket /tmp/x.sock"},
		{"fd, owner, isolation", backend.HelperSpec{Executable: "vmnetctl", Attachment: a, Network: nets.Get("host"), UID: 1000, GID: 100, FD: 3, NetworksFile: "n"},
			"vmnetctl helper --networks n --network host --interface-id " + id + " --tap " + api.TapName(id) + " --stats-interval 0 --log-timestamps --uid 1000 --gid 100 --enable-isolation --fd 3"},
		// (no relay: no shaping)
		{"tap", backend.HelperSpec{Executable: "vmnetctl", Attachment: &api.Attachment{VM: "dev", MAC: a.MAC, MACDerived: true, Attach: api.AttachTAP}, Network: nets.Get("shared"), UID: -1, FD: -1, NetworksFile: "n", ShapingFile: "/s/helpers/dev.0.shaping"},
			"vmnetctl helper --networks n --network shared --interface-id " + id + " --tap " + api.TapName(id) + " --stats-interval 0 --log-timestamps --enable-tso --enable-checksum-offload --attach tap"},
		// A MAC the VM file sets is the only one the guard lets through;
		// spoofCheck: false leaves the port unguarded.
		{"MAC set, no spoof check", backend.HelperSpec{Executable: "vmnetctl", Attachment: &api.Attachment{VM: "dev", MAC: a.MAC, Attach: api.AttachSocket, NoSpoofCheck: true}, Network: nets.Get("host"), UID: -1, FD: -1, Socket: "/s", NetworksFile: "n"},
			"vmnetctl helper --networks n --network host --interface-id " + id + " --tap " + api.TapName(id) + " --stats-interval 0 --log-timestamps --enable-isolation --mac 52:55:55:00:00:01 --no-spoof-check --socket /s"},
	} {
		argv, err := Backend{}.HelperCommand(tc.spec)
		if got := strings.Join(argv, " "); err != nil || got != tc.want {
			t.Errorf("%s:\n got %q, %v\nwant %q", tc.name, got, err, tc.want)
		}
	}
}

// TestHelperEnv: a helper started for a state dir is told it, so that the
// VM port it makes carries that state dir's mark; without one, nothing.
func TestHelperEnv(t *testing.T) {
	env := Backend{}.HelperEnv(backend.HelperSpec{Owner: "/var/lib/x"})
	if !slices.Contains(env, hostnet.EnvOwner+"=/var/lib/x") || !slices.Contains(env, "VMNETCTL_UNDER_CONTROLLER=1") {
		t.Errorf("HelperEnv with an owner: %q", env)
	}
	if env := (Backend{}).HelperEnv(backend.HelperSpec{}); slices.ContainsFunc(env, func(e string) bool { return strings.HasPrefix(e, hostnet.EnvOwner+"=") }) {
		t.Errorf("HelperEnv without an owner: %q", env)
	}
}
