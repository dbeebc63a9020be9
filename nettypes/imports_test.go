package nettypes

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestImportsGoOneWay: the data plane (netplane) and the helper do not
// import backend, which composes them: the values they share are
// nettypes' (docs/architecture.md, the import order); the network's
// services (DNS proxy, leases, DHCP, router advertisements, ND) import
// neither the network nor what is above it; the controller's daemon and
// the CLI's use cases meet only at its socket (ctlapi) and the state dir.
func TestImportsGoOneWay(t *testing.T) {
	deps := func(pkg string) string {
		t.Helper()
		out, err := exec.Command("go", "list", "-deps", "github.com/vmnetctl/vmnetctl/"+pkg).Output()
		if err != nil {
			t.Skipf("go list: %v", err)
		}
		return string(out)
	}
	for _, pkg := range []string{"netplane", "helper"} {
		if strings.Contains(deps(pkg), "github.com/vmnetctl/vmnetctl/backend\n") {
			t.Errorf("%s imports backend", pkg)
		}
	}
	// The network's services are leaves: the network wires them, they
	// never reach back up to it (or past it).
	for _, pkg := range []string{"dnsproxy", "leases", "dhcpserver", "routeradv", "nd6", "arplearn", "hostnet", "overlay", "guard", "shaper", "capture", "egressproxy"} {
		for _, up := range []string{"netplane", "backend", "controller"} {
			if strings.Contains(deps(pkg), "github.com/vmnetctl/vmnetctl/"+up+"\n") {
				t.Errorf("%s imports %s", pkg, up)
			}
		}
	}
	// The relay is a leaf (vmnetctl-relay, one process a VM, links it
	// alone), and so is the vhost-user backend, which shares its frame
	// merging: each imports the relay and what the relay does.
	leaf := []string{"vhostuser", "relay", "rtlink", "helperproto", "checksum"}
	for _, of := range []string{"vhostuser", "relay", "rtlink"} {
		for _, line := range strings.Split(deps(of), "\n") {
			if pkg, ok := strings.CutPrefix(line, "github.com/vmnetctl/vmnetctl/"); ok && !slices.Contains(leaf, pkg) {
				t.Errorf("%s imports %s", of, line)
			}
		}
	}
	// The daemon and the CLI's use cases import neither each other; what
	// both import (the socket's contract, the desired state, starting a
	// helper) imports neither.
	sides := map[string][]string{
		"controller": {"ops"},
		"ops":        {"controller"},
		"ctlapi":     {"controller", "ops", "spec", "launch"},
		"spec":       {"controller", "ops", "launch"},
		"launch":     {"controller", "ops"},
	}
	for pkg, ups := range sides {
		for _, up := range ups {
			if strings.Contains(deps(pkg), "github.com/vmnetctl/vmnetctl/"+up+"\n") {
				t.Errorf("%s imports %s", pkg, up)
			}
		}
	}
}
