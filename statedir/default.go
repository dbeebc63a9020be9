// Package statedir owns vmnetctl's state directory: every path and file
// name in it, its locks, the projects that `up` recorded, the networks.yaml
// they were resolved against, and the runtime records of the helpers that
// run. Nothing else names a file of the state dir; everything asks a Dir.
//
// The layout (see docs/controller.md):
//
//	ops.lock            serialises up, down and run
//	controller.lock     held by the one controller of the dir
//	controller.sock     the controller's API
//	controller.log      the background controller's output
//	networks.json       the networks.yaml `up` used: {source, data}
//	networks.yaml       the same bytes, for helpers' --networks
//	projects/NAME.json  one per project: its VM files, as they were
//	runtime.json        what was applied: the networks.yaml, the files
//	                    of applied/ that hold the projects
//	records/VM.I.json   a running helper's record
//	applied/NAME.HASH.json  a project as applied
//	run/PROJECT.json    the helpers `vmnetctl run` started
//	helpers/VM.I.json   a helper's ready line; helpers/VM.I.log its stderr
//	vms/VM/I.sock       a helper's socket; vms/VM/I.vm.sock the VMM's end
//	leases/ID.leases.json  the DHCP server's leases of network ID
//	networks/ID.sock    network ID's stream socket (api.Network.Socket)
//
// The projects, networks.json and the leases are kept where they outlive
// a reboot (Dir.KeepDir: keep.go), which for a state dir under /run is
// not the state dir itself.
package statedir

import (
	"os"
	"path/filepath"
)

// Root is root's state dir (Default as root).
const Root = "/run/vmnetctl"

// Default is where vmnetctl keeps its state: /run/vmnetctl for root, else
// $XDG_RUNTIME_DIR/vmnetctl, else ~/.local/state/vmnetctl.
func Default() string {
	if os.Geteuid() == 0 {
		return Root
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "vmnetctl")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".local", "state", "vmnetctl")
	}
	return filepath.Join(os.TempDir(), "vmnetctl")
}

// Canonical is path as one spelling for every way of naming it: absolute,
// with the symbolic links of its existing part resolved (/var/run/vmnetctl
// is /run/vmnetctl). What a state dir makes carries its identity (owner
// marks, helpers' command lines), so two spellings of one directory must
// not be two state dirs. The state dir itself may not exist yet.
func Canonical(path string) string {
	abs, err := filepath.Abs(path)
	if err != nil {
		return path
	}
	rest := ""
	for dir := abs; ; dir = filepath.Dir(dir) {
		if real, err := filepath.EvalSymlinks(dir); err == nil {
			return filepath.Join(real, rest)
		}
		if dir == filepath.Dir(dir) {
			return abs
		}
		rest = filepath.Join(filepath.Base(dir), rest)
	}
}
