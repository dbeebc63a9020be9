package helperexec

import (
	"testing"

	"github.com/vmnetctl/vmnetctl/statedir"
)

func TestIsHelperOf(t *testing.T) {
	sd := statedir.Dir{Path: "/run/vmnetctl"}
	for _, tc := range []struct {
		cmdline []string
		want    bool
	}{
		{[]string{"/usr/bin/vmnetctl", "helper", "--networks", "/run/vmnetctl/networks.yaml", "--network", "shared"}, true},
		{[]string{"/usr/bin/sudo", "--non-interactive", "/opt/vmnet-helper/bin/vmnet-helper", "--socket", "/run/vmnetctl/vms/a/0.sock"}, true},
		{[]string{"/usr/bin/vmnetctl", "helper", "--networks", "/run/vmnetctl-other/networks.yaml"}, false}, // another state dir
		{[]string{"/usr/bin/vmnetctl", "helper", "--delete-link-on-eof", "vmt-0123456789"}, false},          // a helper's cleanup child
		{[]string{"/usr/bin/vmnetctl", "serve", "--state-dir", "/run/vmnetctl"}, false},
		// The command a helper's relay runs to relearn a MAC: its flags.
		{[]string{"/usr/bin/vmnetctl", "helper", "--networks", "/run/vmnetctl/networks.yaml", "--tap", "vmt-0123456789", "--relearn-mac"}, false},
		{[]string{"qemu-system-x86_64", "-netdev", "dgram,local.path=/run/vmnetctl/vms/a/0.vm.sock"}, false},
	} {
		if got := isHelperOf(sd, tc.cmdline); got != tc.want {
			t.Errorf("isHelperOf(%q) = %v, want %v", tc.cmdline, got, tc.want)
		}
	}
}
